"""Deterministic orchestration: the session loop, the checkpoint chain, rollups."""
