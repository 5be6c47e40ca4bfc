"""Forgetting one card in Temporal: a small workflow whose one activity runs on the vault's
queue (the vault's one writer; the rules: schemas.vault.forget).

Invariants:
- The client starts it (keel.card_forget) and waits for its result; the activity is
  idempotent, so a retry, or the workflow started again, finds what is left and takes it.
- It touches no session's workflow and is not part of a session's history.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.vault.forget import ForgetCardActivities
    from schemas.vault.forget import FORGET_CARD_WORKFLOW, CardForgotten, ForgetCardInput
    from workflows.branch import refusal
    from workflows.bundle_memory import MEMORY_CALL
    from workflows.options import on_vault_queue

__all__ = ["ForgetCardWorkflow"]


@workflow.defn(name=FORGET_CARD_WORKFLOW)
class ForgetCardWorkflow:
    @workflow.run
    async def run(self, data: ForgetCardInput) -> CardForgotten:
        try:
            done: CardForgotten = await workflow.execute_activity_method(
                ForgetCardActivities.forget_memory_card, data, **on_vault_queue(MEMORY_CALL))
        except ActivityError as err:
            raise refusal(err) from None
        return done
