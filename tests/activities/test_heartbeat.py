"""`@beating`: an activity that heartbeats while it runs, registered as Temporal reads it."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta

import pytest
from temporalio import activity
from temporalio.testing import ActivityEnvironment

from activities.heartbeat import beating


class Steps:
    def __init__(self) -> None:
        self.seen: list[str] = []

    @activity.defn
    @beating
    async def slow_step(self, text: str) -> str:
        await asyncio.sleep(0.5)
        self.seen.append(text)
        return text.upper()


def _env(heartbeat_s: float) -> tuple[ActivityEnvironment, list[float]]:
    env = ActivityEnvironment()
    beats: list[float] = []
    env.on_heartbeat = lambda *details: beats.append(time.monotonic())
    env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=heartbeat_s))
    return env, beats


async def test_a_beating_step_beats_while_it_runs_and_returns_its_result() -> None:
    steps = Steps()
    env, beats = _env(0.4)  # a beat every 0.1 s
    assert await env.run(steps.slow_step, "done") == "DONE"
    assert steps.seen == ["done"]
    assert len(beats) >= 3


async def test_no_beat_after_the_step_returns() -> None:
    env, beats = _env(0.4)
    await env.run(Steps().slow_step, "x")
    count = len(beats)
    await asyncio.sleep(0.3)
    assert len(beats) == count


async def test_a_cancelled_step_is_cancelled_inside_and_stops_beating() -> None:
    started = asyncio.Event()
    cancelled: list[bool] = []

    @activity.defn
    @beating
    async def waits(_: str) -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    env, beats = _env(0.4)
    run = asyncio.create_task(env.run(waits, "x"))
    await started.wait()
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    count = len(beats)
    await asyncio.sleep(0.3)
    assert cancelled == [True] and len(beats) == count


def test_temporal_reads_the_steps_own_argument_and_result_types() -> None:
    from temporalio.common import _type_hints_from_func

    from activities.checkpoint import CheckpointActivities
    from activities.checkpoint_payloads import CheckResult
    from activities.record import Inserted, RecordInput
    from activities.session import SessionActivities

    assert _type_hints_from_func(SessionActivities.record_input) == ([RecordInput], Inserted)
    assert _type_hints_from_func(CheckpointActivities.validate_checkpoint) == ([str],
                                                                             CheckResult)
    assert activity._Definition.must_from_callable(  # the name is the method's
        SessionActivities.record_input).name == "record_input"


async def test_a_beating_step_called_outside_an_activity_just_runs() -> None:
    # The vault's transcript outbox calls append_transcripts itself.
    steps = Steps()
    assert await steps.slow_step("outbox") == "OUTBOX"
    assert steps.seen == ["outbox"]
