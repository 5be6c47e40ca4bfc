"""workers.worker.serve_until: a served process freezes start-up's heap once its workers
poll, so the collector's full passes no longer walk it; a worker that stops on its own ends
it."""

from __future__ import annotations

import asyncio
import gc
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

import workers.worker
from schemas.config import KeelSettings


async def test_a_served_worker_freezes_what_start_up_made(
        client: Client, database_url: str, tmp_path: Path) -> None:
    built = workers.worker.build_worker(client, KeelSettings(
        data_dir=tmp_path, task_queue=f"serve-{uuid.uuid4().hex[:8]}",
        database_url=database_url), role=workers.worker.Role.SESSIONS)
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    frozen: list[int] = []
    stop = asyncio.Event()

    async def ready() -> None:
        frozen.append(gc.get_freeze_count())
        stop.set()

    try:
        assert await workers.worker.serve_until(built, stop, ready)
        assert frozen and frozen[0] > 0  # frozen by the time the workers poll
    finally:
        gc.unfreeze()  # this test process goes on to other tests


async def test_a_worker_that_stops_on_its_own_ends_the_served_process(
        client: Client, database_url: str, tmp_path: Path) -> None:
    """Each worker is built with the SDK's fatal-error hook; when a worker calls it (its
    polls refused for good), `serve_until` shuts the rest down and raises, so the process
    ends for its supervisor to restart, where it lived on serving nothing."""
    built = workers.worker.build_worker(client, KeelSettings(
        data_dir=tmp_path, task_queue=f"fatal-{uuid.uuid4().hex[:8]}",
        database_url=database_url), role=workers.worker.Role.SESSIONS)
    hooks = [w.config()["on_fatal_error"] for w in built.workers]
    assert hooks and all(hook is not None for hook in hooks)
    stop = asyncio.Event()

    async def ready() -> None:  # the hook, called as the SDK calls it
        await hooks[0](RuntimeError("Poll failure: namespace gone"))  # type: ignore[misc]

    try:
        with pytest.raises(workers.worker.WorkerFailedError, match="namespace gone"):
            await asyncio.wait_for(workers.worker.serve_until(built, stop, ready), 60)
        assert not stop.is_set()
        assert all(w.is_shutdown for w in built.workers)
    finally:
        gc.unfreeze()
