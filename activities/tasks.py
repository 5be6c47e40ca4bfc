"""Stopping a background task, with an end.

Invariant: `stop_task` cancels the task and waits `grace_s`; a task still running then is
cancelled again (a step may answer the first cancel by waiting on something of its own
while it unwinds) and waited for once more; one that outlives that too is left behind and
said in the log. The caller always goes on: no stop can hold a worker's shutdown forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

__all__ = ["stop_task"]

log = logging.getLogger("keel.tasks")


async def stop_task(task: asyncio.Task[object], *, grace_s: float, what: str) -> bool:
    """Cancel `task` and wait for its end, at most two graces; False when it was left."""
    for _ in range(2):  # a second cancel ends a wait the first one started
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=grace_s)
        if done:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                task.result()  # retrieved: its end is this stop
            return True
    log.warning("%s did not stop in %g s; left behind", what, 2 * grace_s)
    return False
