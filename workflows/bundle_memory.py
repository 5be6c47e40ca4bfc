"""The bundle's long memory in Temporal: a small workflow whose one activity runs on the
vault's queue (the vault's one writer), for an export or an import of a session with its
memory (the lines: schemas.bundle_memory; the vault's side: activities.bundle_memory).

Invariants:
- The client starts it, named by the export's, the import's or the deletion's request
  id, and waits for its result: the export then reads what the activity staged, the
  import learns whether its cards were written or which were in the way, the deletion how
  many of the session's daily-note entries left the vault. The activity is idempotent, so a
  workflow started again for the same request finds the same outcome.
- It touches no session's workflow and is not part of a session's history.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.workflow import ActivityConfig

with workflow.unsafe.imports_passed_through():
    from activities.bundle_memory import BundleMemoryActivities
    from schemas.branch import BRANCH_REFUSED
    from schemas.bundle_memory import (
        BUNDLE_MEMORY_WORKFLOW,
        BundleMemoryDone,
        BundleMemoryRequest,
    )
    from workflows.branch import refusal
    from workflows.options import HEARTBEAT, NEVER_RETRY, on_vault_queue

__all__ = ["BundleMemoryWorkflow"]

MEMORY_CALL = ActivityConfig(
    start_to_close_timeout=timedelta(minutes=5), schedule_to_close_timeout=timedelta(minutes=15),
    heartbeat_timeout=HEARTBEAT,
    retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=500),
                             maximum_interval=timedelta(seconds=10),
                             non_retryable_error_types=[*NEVER_RETRY, BRANCH_REFUSED]))


@workflow.defn(name=BUNDLE_MEMORY_WORKFLOW)
class BundleMemoryWorkflow:
    @workflow.run
    async def run(self, data: BundleMemoryRequest) -> BundleMemoryDone:
        method = {"export": BundleMemoryActivities.stage_bundle_memory,
                  "import": BundleMemoryActivities.write_bundle_memory,
                  "forget": BundleMemoryActivities.forget_session_memory}[data.direction]
        try:
            done: BundleMemoryDone = await workflow.execute_activity_method(
                method, data, **on_vault_queue(MEMORY_CALL))
        except ActivityError as err:
            raise refusal(err) from None
        return done
