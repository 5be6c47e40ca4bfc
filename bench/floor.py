"""Temporal's floor for a turn: an Update that runs one activity and returns its result.

Nothing else: no record, no memory, no event stream. It runs in a worker process of its own
(`bench/floor_worker.py`) with Temporal's default sandbox, so what Keel's turn is compared
with is what any Temporal application pays for one model call behind an Update. This module
holds only the workflow (the sandbox re-imports it); the activity lives with the worker.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

FLOOR_ACTIVITY = "bench_floor_model_call"


@workflow.defn(name="BenchFloor")
class FloorWorkflow:
    def __init__(self) -> None:
        self.done = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.done)

    @workflow.update(name="turn")
    async def turn(self, request: str) -> str:
        result: str = await workflow.execute_activity(
            FLOOR_ACTIVITY, request, start_to_close_timeout=timedelta(seconds=30),
            result_type=str)
        return result

    @workflow.signal(name="finish")
    def finish(self) -> None:
        self.done = True
