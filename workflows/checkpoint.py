"""The checkpoint chain, driven from a session's turn (workflows.turn).

Each step is an activity; the decisions between them are workflow state, so a worker that
dies mid-checkpoint resumes at the same step with the same data (every activity is
idempotent by its attempt id). A checkpoint that fails changes nothing: the chain answers
with a `CheckpointOutcome` (what was stored, or None and why), and the turn adopts what was
stored. A step that gave up ends the chain with its reason in the outcome; the chain never
raises it. A memory flush that fails never fails the checkpoint, and is never silent: the
session's `on_flush_failed` records it (`last_error`, an error event, a notice).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from temporalio import workflow
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
    from schemas.budget import Spend
    from schemas.checkpoint.budgets import MAX_TOOL_ROUNDS
    from schemas.checkpoint.policy import learned_ratio, portion_after_refusal, remember_saving
    from schemas.events import CheckpointKind
    from schemas.model import REFUSED_AS_TOO_LARGE, TooLong
    from schemas.session import SessionState
    from workflows.failures import reason
    from workflows.options import (
        CHECKPOINT_ROUND,
        CHECKPOINT_STEP,
        MEMORY_FLUSH,
        on_vault_queue,
    )

__all__ = ["CheckpointChain", "CheckpointOutcome"]


@dataclass
class CheckpointOutcome:
    """What one checkpoint (or move of the earliest half) did: read by the turn that asked
    for it, for its event, its log line and its trace."""

    stored: StoreResult | None = None  # None: the session keeps the checkpoint it has
    kind: CheckpointKind = CheckpointKind.FULL
    reason: str = ""  # why nothing was stored
    rounds: int = 0  # the checkpoint turn's rounds of the last attempt
    repair: bool = False  # the last attempt sent its one repair request
    error: ActivityError | None = None  # the step that gave up, when one did
    # What its model requests cost (the rounds, the repair, the memory flush), whether it
    # stored or not: the session's budget is charged with it.
    spent: Spend = field(default_factory=Spend)
    portion: float = field(default=1.0, repr=False)  # of the window the last attempt condensed

    def finish(self) -> CheckpointOutcome:
        """The kind follows the portion condensed (a move says MOVED itself)."""
        if self.kind is not CheckpointKind.MOVED:
            self.kind = (CheckpointKind.FULL if self.portion >= 1.0
                         else CheckpointKind.EARLIER_PART)
        return self


@dataclass
class _RoundsOutcome:
    rounds_exhausted: bool = False
    abort: str | None = None  # why the turn could not finish; the store step records it
    refused_as_too_large: bool = False
    rounds_used: int = 0
    repair: bool = False  # the one repair request was sent


class CheckpointChain:
    """Takes checkpoints of one session. It reads the session's state and allocates seqs
    from it; the turn has it adopt (`adopt`) what a checkpoint stored."""

    def __init__(self, state: SessionState,
                 on_flush_failed: Callable[[int, ActivityError], Awaitable[None]] | None = None,
                 ) -> None:
        self.state = state
        # Told the number of the checkpoint whose flush failed, and why.
        self.on_flush_failed = on_flush_failed

    def adopt(self, outcome: CheckpointOutcome) -> None:
        """Point the session at the checkpoint `outcome` stored."""
        state, stored = self.state, outcome.stored
        assert stored is not None
        state.checkpoint_id = stored.checkpoint_id
        state.window_start_seq = stored.cut_seq
        state.checkpoint_count += 1
        state.mind_text, state.memo_text = stored.mind_text, stored.memo_text
        state.now_text = stored.now_text
        state.texts_in_store = False  # read or not, these are the session's texts now
        state.context_tokens = stored.window_tokens_after
        state.recent_savings = remember_saving(state.recent_savings, stored.tokens_saved)

    def _attempt_id(self) -> str:
        self.state.checkpoint_attempts += 1
        return f"{self.state.session_id}:a{self.state.checkpoint_attempts}"

    async def checkpoint(self, upto: int, turn_first_seq: int) -> CheckpointOutcome:
        """One checkpoint, over the earlier part on a retry when the API refused the turn as
        too large. Its outcome says what was stored, or why nothing was."""
        out = CheckpointOutcome()
        portion: float | None = 1.0
        try:
            while portion is not None:
                out.portion = portion
                refused_as_too_large = await self._attempt(upto, turn_first_seq, portion, out)
                if out.stored is not None:
                    return out.finish()
                portion = portion_after_refusal(portion) if refused_as_too_large else None
        except ActivityError as err:  # a step gave up: the session keeps its checkpoint
            out.stored, out.error, out.reason = None, err, reason(err)
        return out.finish()

    async def _attempt(self, upto: int, turn_first_seq: int, portion: float,
                       out: CheckpointOutcome) -> bool:
        """One attempt at `portion`; sets `out`. True when the API refused it as too large
        (a smaller portion may go)."""
        state = self.state
        config = state.config
        attempt_id = self._attempt_id()
        prepared = await workflow.execute_activity_method(
            CheckpointActivities.prepare_checkpoint, PrepareInput(
                session_id=state.session_id, attempt_id=attempt_id,
                window_start_seq=state.window_start_seq, upto_seq=upto,
                checkpoint_id=state.checkpoint_id, turn_first_seq=turn_first_seq,
                window=config.window(), model=config.model, portion=portion,
                user_name=config.user_name, usage_ratio=state.usage_ratio,
                agent=config.agent, mcp_tools=state.mcp_tools),
            **CHECKPOINT_STEP)
        out.rounds, out.repair, out.reason = 0, False, ""
        if not prepared.ok:
            out.reason = prepared.reason
            workflow.logger.info("checkpoint skipped: %s", prepared.reason)
            return False
        if prepared.view == "earlier":  # the turn saw only the part it condenses
            out.portion = min(out.portion, 0.5)
        await self._flush(state.window_start_seq, prepared.cut_seq - 1, attempt_id, out)
        turn = await self._turn(attempt_id, out)
        record_seq = state.allocate_seq()
        try:
            stored = await workflow.execute_activity_method(
                CheckpointActivities.store_checkpoint,
                StoreInput(attempt_id=attempt_id, record_seq=record_seq,
                           rounds_exhausted=turn.rounds_exhausted, abort_reason=turn.abort),
                **CHECKPOINT_STEP)
        finally:  # a step that gave up must not hold the window back
            state.settle_seq(record_seq)
        out.rounds, out.repair = turn.rounds_used, turn.repair
        if not stored.stored:
            out.reason = stored.reason
            workflow.logger.warning("checkpoint %s failed: %s", attempt_id, stored.reason)
            return turn.refused_as_too_large
        out.stored = stored
        return False

    async def _turn(self, attempt_id: str, outcome: CheckpointOutcome) -> _RoundsOutcome:
        """The checkpoint turn: at most five rounds of tool calls and one more request for
        the now alone; then the checks, and at most one repair turn like it. A round the
        window has no room for (or the API refused as too long) ends the turn with what
        its rounds wrote, after one last request for the now; only a first round that
        cannot go aborts the attempt."""
        out = _RoundsOutcome()
        rounds_used = 0
        for repair in (False, True):
            if repair:
                check = await workflow.execute_activity_method(
                    CheckpointActivities.validate_checkpoint, attempt_id, **CHECKPOINT_STEP)
                if not check.problems:
                    return out
                out.repair = True
            last_only = False  # a round did not fit: the next asks for the now alone
            for n in range(MAX_TOOL_ROUNDS + 1):
                try:
                    rnd = await workflow.execute_activity_method(
                        CheckpointActivities.checkpoint_round,
                        RoundInput(attempt_id=attempt_id, round_no=rounds_used,
                                   repair=repair and n == 0 and not last_only,
                                   final=n == MAX_TOOL_ROUNDS or last_only),
                        **CHECKPOINT_ROUND)
                except ActivityError as err:
                    out.abort = f"checkpoint turn failed: {err.cause or err}"
                    out.refused_as_too_large = isinstance(err.cause, ApplicationError) and (
                        err.cause.type in REFUSED_AS_TOO_LARGE)
                    return out
                outcome.spent = outcome.spent.plus(rnd.spent)  # charged, stored or not
                if rnd.refused is not None or rnd.no_room:
                    if rnd.refused is not None:
                        self._learn(rnd.refused)
                    if rounds_used == 0:  # nothing written: a smaller view may go
                        out.abort = ("checkpoint turn refused as too long" if rnd.refused
                                     else "no room in the window for the checkpoint turn")
                        out.refused_as_too_large = True
                        return out
                    if not (rnd.final or last_only):
                        last_only = True
                        continue
                    out.rounds_exhausted = True  # the files as edited go to the checks
                    return out
                rounds_used += 1
                out.rounds_used = rounds_used
                if rnd.done:
                    # Only the last request, for the now alone, ends a turn whose rounds ran out.
                    out.rounds_exhausted = n == MAX_TOOL_ROUNDS or rnd.final
                    break
                if last_only:  # the now alone was asked for and tools came back: stop
                    out.rounds_exhausted = True
                    return out
        return out

    def _learn(self, refused: TooLong) -> None:
        """The API's count of a refused request corrects the session's estimates at once."""
        state = self.state
        state.usage_ratio = learned_ratio(
            state.usage_ratio, refused.counted(state.config.window().hard_limit),
            refused.estimate)

    async def _flush(self, from_seq: int, to_seq: int, attempt_id: str,
                     out: CheckpointOutcome) -> None:
        """Durable facts of the part moving out go to cards first, so condensing never
        loses them silently. Its request shares the attempt's prefix (read from the prompt
        cache). Best effort: a failed flush is recorded, and the checkpoint goes on."""
        scope = self.state.config.memory_scope
        if scope is None:  # a session without long memory flushes nothing
            return
        try:
            flushed = await workflow.execute_activity_method(
                MemoryActivities.flush_memory,
                FlushInput(session_id=self.state.session_id, from_seq=from_seq, to_seq=to_seq,
                           scope=scope, attempt_id=attempt_id),
                **on_vault_queue(MEMORY_FLUSH))
            out.spent = out.spent.plus(flushed.spent)
        except ActivityError as err:
            workflow.logger.warning("memory flush failed: %s", err.cause or err)
            if self.on_flush_failed is not None:
                await self.on_flush_failed(self.state.checkpoint_count + 1, err)

    async def move_half(self, upto: int, turn_first_seq: int) -> CheckpointOutcome:
        """Move about the earliest half out without the model; nothing stored when nothing
        can be moved or the step gave up."""
        out = CheckpointOutcome(kind=CheckpointKind.MOVED)
        try:
            out.stored = await self._move(upto, turn_first_seq)
        except ActivityError as err:
            out.error, out.reason = err, reason(err)
        return out

    async def _move(self, upto: int, turn_first_seq: int) -> StoreResult | None:
        state = self.state
        record_seq = state.allocate_seq()
        try:
            stored = await workflow.execute_activity_method(
                CheckpointActivities.move_earliest_half, MoveInput(
                    session_id=state.session_id, attempt_id=self._attempt_id(),
                    record_seq=record_seq, window_start_seq=state.window_start_seq,
                    upto_seq=upto, checkpoint_id=state.checkpoint_id,
                    turn_first_seq=turn_first_seq, window=state.config.window(),
                    user_name=state.config.user_name),
                **CHECKPOINT_STEP)
        finally:
            state.settle_seq(record_seq)
        if not stored.stored:
            workflow.logger.warning("move-half impossible: %s", stored.reason)
            return None
        return stored
