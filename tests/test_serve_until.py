"""workers.worker.serve_until: a served process freezes start-up's heap once its workers
poll, so the collector's full passes no longer walk it."""

from __future__ import annotations

import asyncio
import gc
import uuid
from pathlib import Path

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
