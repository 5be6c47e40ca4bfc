"""The checkpoint's activities: write the two files, one bounded model round, the checks,
assemble and store; and the move-half path that needs no model.

Every step is keyed by its attempt id: a retried step finds its own work in
`checkpoint_attempts` / `checkpoints` and returns it instead of doing it twice.

The checkpoint turn's requests carry the same tools, system prompt and (pre-passed)
conversation prefix as the request they interrupt, with cache breakpoints, so they read
that prefix from the prompt cache; its limits (read files, edit only the mind and memo
files) are enforced on the calls it makes, never by changing the tools list. Its view
(`schemas.checkpoint.policy.checkpoint_view`) is the whole conversation when the turn fits
the window, else all of it but the newest tool output's text, else the largest earlier
part that fits.

The activities work over the worker's one session context (activities.context), passed
in; the steps live in activities.checkpoint_prepare (the cut, the view, the files),
activities.checkpoint_turn (the rounds, the flush's request) and activities.
checkpoint_store (the checks, storing, the move-half path). The model is asked in one
method (`_ask_model`).
"""

from __future__ import annotations

import json
from typing import Any

from anthropic.types import Message
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import checkpoint_attempts as attempts
from activities import checkpoint_turn as turn
from activities.checkpoint_payloads import (
    CheckResult,
    MoveInput,
    PrepareInput,
    PrepareResult,
    RoundInput,
    RoundResult,
    StoreInput,
    StoreResult,
    checkpoint_id_for,
)
from activities.checkpoint_prepare import prepare
from activities.checkpoint_store import check, move_half, store_model_checkpoint
from activities.context import SessionContext
from activities.events import tell_retrying
from activities.heartbeat import beating, with_heartbeat
from activities.model_call import refusal
from schemas.agent import fallback_model
from schemas.budget import Spend
from schemas.model import CHECKPOINT_CALL_ATTEMPTS, PROMPT_TOO_LONG

__all__ = [
    "CheckResult", "CheckpointActivities", "MoveInput", "PrepareInput", "PrepareResult",
    "RoundInput", "RoundResult", "StoreInput", "StoreResult", "checkpoint_id_for",
]


class CheckpointActivities:
    """The checkpoint's activities over one worker's session context."""

    def __init__(self, ctx: SessionContext) -> None:
        self.ctx = ctx

    @activity.defn
    @beating
    async def prepare_checkpoint(self, data: PrepareInput) -> PrepareResult:
        async with await self.ctx.connection() as conn:
            return await prepare(self.ctx, conn, data)

    @activity.defn
    async def checkpoint_round(self, data: RoundInput) -> RoundResult:
        async with await self.ctx.connection() as conn:
            attempt = await attempts.attempt(conn, data.attempt_id)
            rounds: list[dict[str, Any]] = attempt["rounds"][1:]
            if len(rounds) > data.round_no:  # this round already ran: report it again
                done_round = rounds[data.round_no]
                return RoundResult(done=not done_round["results"],
                                   tool_calls=len(done_round["results"]),
                                   final=bool(done_round.get("final")),
                                   spent=Spend.model_validate(done_round.get("spent") or {}))
            planned = await turn.round_request(self.ctx, conn, attempt, data)
            if planned.request is None:  # not even the now fits: the files stand as they are
                return RoundResult(done=True, no_room=True, final=planned.final)
            try:
                message = await self._ask_model(attempts.meta(attempt), planned.request)
            except ApplicationError as err:
                if err.type != PROMPT_TOO_LONG:
                    meta = attempts.meta(attempt)
                    await tell_retrying(attempt["session_id"], None, err,
                                        CHECKPOINT_CALL_ATTEMPTS, meta.model, fallback_model(
                                            meta.agent, self.ctx.settings.model.fallback_model))
                    raise
                # The API's count: the session corrects its estimate, the turn keeps what
                # its rounds wrote (workflows.checkpoint).
                return RoundResult(done=True, final=planned.final,
                                   refused=refusal(err, planned.predicted))
            return await turn.run_round(self.ctx, conn, attempt, data, planned, message)

    async def _ask_model(self, meta: PrepareInput, request: dict[str, Any]) -> Message:
        """One round's reply from the worker's own model (the offline one takes the
        session's window as its own)."""
        worker = self.ctx.settings.model
        model = worker.model_copy(update={
            "context_window": meta.window.context_window,
            "fallback_model": fallback_model(meta.agent, worker.fallback_model)})
        return await with_heartbeat(self.ctx.model.create(model, request))

    @activity.defn
    @beating
    async def validate_checkpoint(self, attempt_id: str) -> CheckResult:
        async with await self.ctx.connection() as conn:
            attempt = await attempts.attempt(conn, attempt_id)
            found = await check(conn, attempt, attempts.meta(attempt).budgets())
            await conn.execute(
                "UPDATE checkpoint_attempts SET problems=%s, repair_sent = repair_sent OR %s"
                " WHERE attempt_id=%s",
                (json.dumps([p.model_dump() for p in found.problems]), bool(found.problems),
                 attempt_id))
            return CheckResult(problems=found.problems)

    @activity.defn
    @beating
    async def store_checkpoint(self, data: StoreInput) -> StoreResult:
        async with await self.ctx.connection() as conn:
            return await store_model_checkpoint(self.ctx, conn, data)

    @activity.defn
    @beating
    async def move_earliest_half(self, data: MoveInput) -> StoreResult:
        async with await self.ctx.connection() as conn:
            return await move_half(self.ctx, conn, data)

    @activity.defn
    async def checkpoint_texts(self, checkpoint_id: str) -> StoreResult:
        """A stored checkpoint's mind, memo and now, for a run that continued as new
        without them (workflows.carry)."""
        async with await self.ctx.connection() as conn:
            found = await attempts.stored(conn, checkpoint_id)
        if found is None:
            raise ApplicationError(f"no checkpoint {checkpoint_id!r}", non_retryable=True,
                                   type="NoSuchCheckpoint")
        return found
