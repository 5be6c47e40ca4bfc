"""Erasing a memory scope in Temporal: a small workflow whose one activity runs on the
vault's queue (the vault's one writer; the rules: schemas.vault.erase).

Invariants:
- The client starts it (keel.scope_erase) once it has checked that no session of the scope
  runs, and waits for its result; the activity is idempotent, so a retry, or the workflow
  started again, finds what is left and takes it.
- It touches no session's workflow and is not part of a session's history.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.vault.erase import ScopeEraseActivities
    from schemas.vault.erase import ERASE_SCOPE_WORKFLOW, EraseScopeInput, ScopeErased
    from workflows.branch import refusal
    from workflows.bundle_memory import MEMORY_CALL
    from workflows.options import on_vault_queue

__all__ = ["EraseScopeWorkflow"]


@workflow.defn(name=ERASE_SCOPE_WORKFLOW)
class EraseScopeWorkflow:
    @workflow.run
    async def run(self, data: EraseScopeInput) -> ScopeErased:
        try:
            done: ScopeErased = await workflow.execute_activity_method(
                ScopeEraseActivities.erase_memory_scope, data, **on_vault_queue(MEMORY_CALL))
        except ActivityError as err:
            raise refusal(err) from None
        return done
