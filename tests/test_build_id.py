"""workers.build_id: Keel's workers name their code with a hash of Keel's own source, never
the SDK's default (which compiles every loaded module where Python writes no bytecode)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

import workers.build_id as build_id
import workers.worker
from schemas.config import KeelSettings


def test_the_id_follows_the_source_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         ) -> None:
    for package in build_id.KEEL_PACKAGES:
        shutil.copytree(build_id.ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    build_id.keel_build_id.cache_clear()
    monkeypatch.setattr(build_id, "ROOT", tmp_path)
    try:
        first = build_id.keel_build_id()
        build_id.keel_build_id.cache_clear()
        assert build_id.keel_build_id() == first  # the same checkout, the same id
        (tmp_path / "workflows" / "session.py").write_text("# changed\n", encoding="utf-8")
        build_id.keel_build_id.cache_clear()
        assert build_id.keel_build_id() != first
    finally:
        build_id.keel_build_id.cache_clear()


async def test_the_workers_never_compute_the_sdks_default(
        client: Client, database_url: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> str:
        raise AssertionError("the SDK's default build id was computed")

    monkeypatch.setattr("temporalio.worker._worker.load_default_build_id", refuse)
    built = workers.worker.build_worker(client, KeelSettings(
        data_dir=tmp_path, task_queue=f"build-id-{uuid.uuid4().hex[:8]}",
        database_url=database_url), role=workers.worker.Role.SESSIONS)
    async with built:  # started and shut down: no worker is left polling
        assert [w.config()["build_id"] for w in built.workers] == [build_id.keel_build_id()]
