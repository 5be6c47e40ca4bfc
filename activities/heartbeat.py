"""The one heartbeat rule for activities that wait on something slow (a model, an MCP server).

Invariant: while `with_heartbeat(awaitable)` waits, the activity heartbeats every quarter
of its heartbeat timeout (as the SDK's contrib/openai_agents does), so a worker must miss
several beats before Temporal gives up on it; with no heartbeat timeout, every
`DEFAULT_BEAT_S`. The awaitable runs in the caller's own task (a cancellation reaches it
directly, and its cleanup finishes before this returns); the beats come from a side task
that is stopped, and awaited, on the way out. `@beating` does the same for a whole activity
(a step a worker's death can catch mid-way: its options give it a heartbeat timeout).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import suppress
from typing import Any, TypeVar, cast

from temporalio import activity

__all__ = ["BEATS_PER_TIMEOUT", "DEFAULT_BEAT_S", "beat_interval", "beating", "with_heartbeat"]

T = TypeVar("T")
# An activity function or method, its type kept whole (Temporal reads its hints).
F = TypeVar("F", bound=Callable[..., Coroutine[Any, Any, Any]])
# Beats per heartbeat timeout: a worker must miss several before Temporal gives up on it.
BEATS_PER_TIMEOUT = 4
DEFAULT_BEAT_S = 5.0


def beat_interval() -> float:
    """A quarter of this activity's heartbeat timeout, or `DEFAULT_BEAT_S` without one."""
    timeout = activity.info().heartbeat_timeout
    if not timeout:
        return DEFAULT_BEAT_S
    return max(0.1, timeout.total_seconds() / BEATS_PER_TIMEOUT)


async def _beat_every(interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        with suppress(RuntimeError):  # the activity has just finished: nothing to tell
            activity.heartbeat()


async def with_heartbeat(awaitable: Awaitable[T]) -> T:
    """Await a long call while telling Temporal the activity is alive (outside an
    activity, as the vault's transcript outbox calls a step, just await it)."""
    if not activity.in_activity():
        return await awaitable
    heart = asyncio.create_task(_beat_every(beat_interval()))
    try:
        return await awaitable
    finally:
        heart.cancel()
        await asyncio.wait({heart})  # never raises: the caller's own cancel stays its own


def beating(fn: F) -> F:
    """An activity that heartbeats while it runs (put it under `@activity.defn`)."""
    @functools.wraps(fn)
    async def run(*args: Any, **kwargs: Any) -> Any:
        return await with_heartbeat(fn(*args, **kwargs))
    return cast(F, run)
