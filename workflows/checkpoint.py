"""The checkpoint chain, driven from SessionWorkflow.

Each step is an activity; the decisions between them are workflow state, so a worker that
dies mid-checkpoint resumes at the same step with the same data (every activity is
idempotent by its attempt id). A checkpoint that fails changes nothing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.checkpoint import (
        CheckpointActivities,
        MoveInput,
        PrepareInput,
        RoundInput,
        StoreInput,
        StoreResult,
    )
    from activities.vault.turn import FlushInput, MemoryActivities
    from schemas.budgets import MAX_TOOL_ROUNDS
    from schemas.prepass import should_skip_condensation

if TYPE_CHECKING:
    from workflows.session import SessionWorkflow

STEP_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                         maximum_interval=timedelta(seconds=30), maximum_attempts=10)
MODEL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2),
                          maximum_interval=timedelta(seconds=60), maximum_attempts=8)
# How many recent savings to remember for the anti-thrash rule (schemas.prepass).
SAVINGS_KEPT = 3
MEMORY_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3)


class CheckpointChain:
    def __init__(self, wf: SessionWorkflow) -> None:
        self.wf = wf

    def skip_for_thrash(self) -> bool:
        """Skip a model checkpoint when the recent ones saved little: only the move helps."""
        return should_skip_condensation(self.wf.s.recent_savings,
                                        self.wf.s.config.context_window)

    def _attempt_id(self) -> str:
        self.wf.s.checkpoint_attempts += 1
        return f"{self.wf.s.session_id}:a{self.wf.s.checkpoint_attempts}"

    async def _step(self, method: object, arg: object, *, model: bool = False) -> object:
        return await workflow.execute_activity_method(
            method,  # type: ignore[arg-type]
            arg,
            start_to_close_timeout=timedelta(minutes=10 if model else 2),
            schedule_to_close_timeout=timedelta(minutes=30),
            heartbeat_timeout=timedelta(seconds=20) if model else None,
            retry_policy=MODEL_RETRY if model else STEP_RETRY,
        )

    async def checkpoint(self, upto: int, turn_first_seq: int) -> bool:
        """Run one checkpoint (over the earlier half on a retry when the conversation is
        too large for a checkpoint turn). True when it was stored and made enough room."""
        portion = 1.0
        for _ in range(2):
            result, too_large = await self._attempt(upto, turn_first_seq, portion)
            if result is not None:
                return self._adopt(result)
            if not too_large:
                return False
            portion = 0.5
        return False

    async def _attempt(self, upto: int, turn_first_seq: int,
                       portion: float) -> tuple[StoreResult | None, bool]:
        s = self.wf.s
        attempt_id = self._attempt_id()
        prepared = await self._step(CheckpointActivities.prepare_checkpoint, PrepareInput(
            session_id=s.session_id, attempt_id=attempt_id, window_start_seq=s.window_start_seq,
            upto_seq=upto, checkpoint_id=s.checkpoint_id, turn_first_seq=turn_first_seq,
            context_window=s.config.context_window,
            max_output_tokens=s.config.max_output_tokens,
            price_step_tokens=s.config.price_step_tokens, model=s.config.model,
            portion=portion, user_name=s.config.user_name))
        if not prepared.ok:  # type: ignore[attr-defined]
            workflow.logger.info("checkpoint skipped: %s", prepared.reason)  # type: ignore[attr-defined]
            return None, False
        if workflow.patched("long-memory-v1"):
            await self._flush(s.window_start_seq, prepared.cut_seq - 1)  # type: ignore[attr-defined]
        rounds_used = 0
        rounds_exhausted = False
        abort: str | None = None
        repair = False
        too_large = False
        for phase in ("turn", "repair"):
            if phase == "repair":
                check = await self._step(CheckpointActivities.validate_checkpoint, attempt_id)
                if not check.problems:  # type: ignore[attr-defined]
                    break
                repair = True
            # At most five rounds of tool calls; one more request asks for the now alone.
            for n in range(MAX_TOOL_ROUNDS + 1):
                try:
                    rnd = await self._step(CheckpointActivities.checkpoint_round, RoundInput(
                        attempt_id=attempt_id, round_no=rounds_used, repair=repair and n == 0,
                        final=n == MAX_TOOL_ROUNDS), model=True)
                except ActivityError as err:
                    abort = f"checkpoint turn failed: {err.cause or err}"
                    too_large = isinstance(err.cause, ApplicationError) and (
                        err.cause.type in ("ModelHTTP400", "ModelHTTP413"))
                    break
                rounds_used += 1
                if rnd.done:  # type: ignore[attr-defined]
                    # Only the last request, for the now alone, ends a turn whose rounds ran out.
                    rounds_exhausted = n == MAX_TOOL_ROUNDS
                    break
            if abort:
                break
        record_seq = self.wf.allocate_seq()
        stored: StoreResult = await self._step(CheckpointActivities.store_checkpoint, StoreInput(
            attempt_id=attempt_id, record_seq=record_seq, rounds_exhausted=rounds_exhausted,
            abort_reason=abort))  # type: ignore[assignment]
        self.wf.settle_seq(record_seq)
        if not stored.stored:
            workflow.logger.warning("checkpoint %s failed: %s", attempt_id, stored.reason)
            return None, too_large and portion == 1.0
        return stored, False

    async def _flush(self, from_seq: int, to_seq: int) -> None:
        """Durable facts of the part moving out go to cards first, so condensing never
        loses them silently. Best effort: a failed flush is logged, not fatal."""
        try:
            await workflow.execute_activity_method(
                MemoryActivities.flush_memory,
                FlushInput(session_id=self.wf.s.session_id, from_seq=from_seq, to_seq=to_seq),
                start_to_close_timeout=timedelta(minutes=5), retry_policy=MEMORY_RETRY)
        except ActivityError as err:
            workflow.logger.warning("memory flush skipped: %s", err.cause or err)

    async def move_half(self, upto: int, turn_first_seq: int) -> bool:
        """Move about the earliest half out without the model. False when nothing can."""
        s = self.wf.s
        record_seq = self.wf.allocate_seq()
        stored: StoreResult = await self._step(CheckpointActivities.move_earliest_half, MoveInput(
            session_id=s.session_id, attempt_id=self._attempt_id(), record_seq=record_seq,
            window_start_seq=s.window_start_seq, upto_seq=upto, checkpoint_id=s.checkpoint_id,
            turn_first_seq=turn_first_seq, context_window=s.config.context_window,
            max_output_tokens=s.config.max_output_tokens,
            price_step_tokens=s.config.price_step_tokens,
            user_name=s.config.user_name))  # type: ignore[assignment]
        self.wf.settle_seq(record_seq)
        if not stored.stored:
            workflow.logger.warning("move-half impossible: %s", stored.reason)
            return False
        self._adopt(stored)
        return True

    def _adopt(self, stored: StoreResult) -> bool:
        """Point the session at the new checkpoint; True when it made enough room."""
        s = self.wf.s
        saved = stored.tokens_saved
        if saved is None:
            saved = max(0, s.context_tokens - stored.window_tokens_after)
        s.checkpoint_id = stored.checkpoint_id
        s.window_start_seq = stored.cut_seq
        s.checkpoint_count += 1
        s.mind_text, s.memo_text, s.now_text = stored.mind_text, stored.memo_text, stored.now_text
        s.context_tokens = stored.window_tokens_after
        s.recent_savings = [*s.recent_savings[-(SAVINGS_KEPT - 1):],
                            saved]
        return stored.window_tokens_after <= self.wf.threshold
