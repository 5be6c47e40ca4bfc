"""`keel demo`: the seeded queue, a short run on the test stack, the summary's readers."""

from __future__ import annotations

import asyncio
import io
import logging
import uuid

import psycopg
import pytest
from rich.console import Console
from typer.testing import CliRunner

from keel.cli import app
from keel.demo import (
    DECISION_PRS,
    PR_COUNT,
    drive_session,
    mission_entries,
    queue_position,
    seed_workspace,
)
from schemas.tokens import count_tokens
from tests.harness import keel_worker, make_settings
from tests.logs import undo_configure_logging


def test_seeded_queue(tmp_path):
    seed_workspace(tmp_path)
    queue = (tmp_path / "queue.md").read_text().splitlines()
    prs = sorted(tmp_path.glob("prs/*.md"))
    assert len(prs) == PR_COUNT == 60
    assert [ln.split(":")[0] for ln in queue if ln.startswith("- ")][:2] == [
        "- PR #101", "- PR #102"]  # oldest first
    decisions = [p.stem for p in prs if "needs-decision: yes" in p.read_text()]
    assert decisions == [str(n) for n in DECISION_PRS]
    tokens = [count_tokens(p.read_text()) for p in prs]
    assert 800 <= min(tokens) and max(tokens) <= 1_200
    assert all(p.read_text().startswith(f"# PR #{p.stem}: ") for p in prs)
    assert "Never merge" in (tmp_path / "AGENTS.md").read_text()


def test_summary_readers():
    mind = ("## Goals\n### Mission\n_guidance_\n- Work through the queue\n- Keep CI green\n"
            "### Workstreams\n- PR review queue: reviewed through PR #117; next PR #118.\n")
    assert mission_entries(mind) == ["Work through the queue", "Keep CI green"]
    assert mission_entries("## Goals\n") == []
    assert queue_position("Progress: Done: reviewed through PR #131.", mind) == 131
    assert queue_position("", mind) == 117
    assert queue_position("nothing yet") is None
    assert queue_position("Progress: Done: PRs #101-#130. In progress: #131.") == 130


async def test_short_demo_run_on_the_test_stack(client, database_url, tmp_path):
    settings = make_settings(database_url, tmp_path)  # no API key: the offline model
    buffer = io.StringIO()
    out = Console(file=buffer, width=200)
    async with keel_worker(client, settings) as keel:
        result = await drive_session(keel, settings, turns=4,
                                     session_id=f"demo-{uuid.uuid4().hex[:8]}", out=out)
    text = buffer.getvalue()
    assert result.turns == 4 and result.offline_tagged and not result.errors
    assert "[offline model]" in text
    assert "Reviewed PR #101: approve" in text
    assert result.reviews[:2] == [101, 102]
    assert "What survived" in text and "no checkpoint happened in 4 turns" in text
    assert result.ok  # nothing was lost: nothing was condensed yet


@pytest.fixture
def restore_logging():
    level = logging.getLogger().level
    yield
    undo_configure_logging(level)  # `keel demo` configured logging for the process


async def test_keel_demo_command_with_configured_services(client, database_url, tmp_path,
                                                          restore_logging):
    env = {"TEMPORAL_ADDRESS": client.service_client.config.target_host,
           "DATABASE_URL": database_url, "KEEL_DATA_DIR": str(tmp_path),
           "KEEL_TASK_QUEUE": f"demo-{uuid.uuid4().hex[:8]}", "ANTHROPIC_API_KEY": "",
           "ANTHROPIC_BASE_URL": "", "COLUMNS": "200"}
    result = await asyncio.to_thread(CliRunner().invoke, app, ["demo", "--turns", "3"],
                                     env=env)
    assert result.exit_code == 0, (result.output, result.exception)
    assert "[offline model]" in result.output
    assert "offline deterministic model (no API key)" in result.output
    assert "What survived" in result.output
    # DATABASE_URL set: the queue is seeded into PostgreSQL, where every worker reads it,
    # not into a folder of this process.
    assert not (tmp_path / "workspaces").exists()
    with psycopg.connect(database_url) as conn:
        paths = {p for (p,) in conn.execute("SELECT path FROM workspace_files")}
    assert {"queue.md", "AGENTS.md", "prs/101.md", "reviews/101.md"} <= paths


async def test_demo_run_through_a_checkpoint_keeps_what_matters(client, database_url, tmp_path):
    settings = make_settings(database_url, tmp_path)
    buffer = io.StringIO()
    async with keel_worker(client, settings) as keel:
        result = await drive_session(keel, settings, turns=24,
                                     session_id=f"demo-{uuid.uuid4().hex[:8]}",
                                     out=Console(file=buffer, width=200))
    text = buffer.getvalue()
    assert result.checkpoints >= 1, text
    assert "◆ checkpoint 1" in text and 'Watch ci-main "CI status"' in text
    assert dict(result.survival()) == {
        "Mission": True, "your words": True, "queue position": True,
        "Watch text kept out of your words": True}, text
    assert result.ok and "✓ all survived" in text
    assert result.position is not None and result.position in result.reviews


async def test_the_demo_works_from_another_folder_than_the_worker(client, database_url,
                                                                  tmp_path):
    """Issue 12's opening: the demo in one folder, the worker in another, each with its own
    local workspace store. The demo puts the queue in through the session, so the worker
    finds it, and reads the reviews back the same way."""
    here = make_settings(database_url, tmp_path / "demo")
    there = here.model_copy(update={"data_dir": tmp_path / "worker"})
    async with keel_worker(client, there) as worker_side:
        keel = type(worker_side)(client, here.task_queue, here)
        result = await drive_session(keel, here, turns=3,
                                     session_id=f"demo-{uuid.uuid4().hex[:8]}",
                                     out=Console(file=io.StringIO(), width=200))
    assert result.reviews[:2] == [101, 102] and not result.errors
    assert (tmp_path / "worker" / "workspaces" / result.session_id / "queue.md").is_file()
    assert not (tmp_path / "demo" / "workspaces").exists()  # nothing written beside the demo


def test_no_review_written_says_the_worker_did_not_find_the_queue():
    from keel.demo import DemoResult, _summary

    buffer = io.StringIO()
    _summary(Console(file=buffer, width=400), DemoResult(session_id="demo-x", turns=1))
    text = " ".join(buffer.getvalue().split())
    assert "run more turns" not in text
    assert ("no review was written: the worker that ran the agent's tools did not find the "
            "queue the demo put into the session's workspace") in text
    assert "KEEL_WORKSPACE_STORE=postgres" in text and "`keel files demo-x`" in text
