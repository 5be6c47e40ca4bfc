"""A Keel worker as a process of its own (`start_worker`) and a wait until it serves its
task queue (`polling`), for the tests that kill a worker and start another."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path


def start_worker(env: dict[str, str]) -> subprocess.Popen:
    """A worker process; its log goes to a file in its data folder (a pipe nobody reads
    would fill and stop the worker mid-test)."""
    folder = Path(env.get("KEEL_DATA_DIR") or tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"worker-{uuid.uuid4().hex[:8]}.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "workers.main", "both"], env=env,
                                stdout=subprocess.DEVNULL, stderr=stderr)
    proc.args = [*proc.args, f"log={log}"]  # type: ignore[misc]  # said when it never polls
    return proc


async def polling(client, queue: str, proc: subprocess.Popen, within_s: float = 150) -> None:
    """Until worker `proc` polls `queue` for workflow tasks; else fail with its log's end
    (a worker process starting on a loaded machine has taken over a minute)."""
    from keel._queues import pollers

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and proc.poll() is None:
        if any(p.identity.startswith(f"{proc.pid}@") for p in await pollers(client, queue)):
            return
        await asyncio.sleep(0.2)
    log = Path(str(proc.args[-1]).removeprefix("log="))  # type: ignore[index]
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    raise AssertionError(f"worker {proc.pid} never polled {queue} (exit {proc.poll()}):\n"
                         f"{tail}")
