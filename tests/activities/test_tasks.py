"""activities.tasks.stop_task: a stop that always ends."""

from __future__ import annotations

import asyncio
import time

from activities.tasks import stop_task


def _stubborn(cancels_to_end: int) -> tuple[asyncio.Task[None], list[int]]:
    """A task that ends at its `cancels_to_end`-th cancel."""
    seen = [0]

    async def run() -> None:
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                seen[0] += 1
                if seen[0] >= cancels_to_end:
                    raise

    return asyncio.create_task(run()), seen


async def test_a_task_ends_at_its_first_or_second_cancel_and_is_reported_stopped():
    for needed in (1, 2):
        task, seen = _stubborn(needed)
        await asyncio.sleep(0)
        started = time.monotonic()
        assert await stop_task(task, grace_s=1.0, what="t")
        assert task.done() and seen[0] == needed
        # No grace waited out by a task that ended at its first cancel; one by the other.
        assert needed - 1 <= time.monotonic() - started < needed


async def test_a_task_that_outlives_two_graces_is_left_and_the_stop_goes_on():
    task, seen = _stubborn(3)
    await asyncio.sleep(0)
    started = time.monotonic()
    assert not await stop_task(task, grace_s=0.1, what="t")
    assert 0.2 <= time.monotonic() - started < 0.5 and not task.done() and seen[0] == 2
    task.cancel()  # its third: ended here, not left to the loop's close
    await asyncio.wait({task}, timeout=5)
    assert task.done()


async def test_a_task_that_already_failed_is_stopped_without_raising():
    async def fail() -> None:
        raise RuntimeError("broken")

    task = asyncio.create_task(fail())
    await asyncio.sleep(0)
    assert await stop_task(task, grace_s=0.1, what="t")
