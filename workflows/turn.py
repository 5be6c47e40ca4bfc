"""Turns: one session's turns, each a few model calls and the tool calls between them.

Invariants:
- A plain turn is one activity before its reply: its first model call records the messages
  folded into it (workflows.inbox) and searches long memory (activities.session), then
  answers. When a request would not fit, the turn walks the room-making ladder of
  `schemas.checkpoint.policy`, one rung at a time (a checkpoint, moving the earliest half,
  cutting the newest output, sending as is, or stopping the session as too long).
- A turn's state is one `TurnState`, new each turn; the durable part of a turn that waits on
  a person is its `TurnInProgress`, which goes with the state over continue-as-new so the
  new run resumes the turn at the waiting call.
- A failed model call is said (`last_error`, an ErrorEvent where "model") and its reply's
  seq fenced with that notice, where a late reply would go. A failed checkpoint changes
  nothing but the count that may stop this turn's next one.
- The daily transcript is queued by each model call with its reply (workflows.transcript):
  nothing runs in the session after the reply but what a failed call leaves to append in
  the background. A failed recall is said
  (`last_error`, an ErrorEvent where "memory", and a notice in the record after the
  reply), and never holds the turn up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import NamedTuple, Protocol

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.model_call import DelegationStep
    from activities.session import (
        INPUT_NOT_RECORDED,
        MemoryStep,
        ModelAsk,
        ModelCallInput,
        ModelCallResult,
        RecordInput,
        RecordStep,
        RoomSteps,
        SessionActivities,
        WindowSpan,
    )
    from schemas.budget import spend_of
    from schemas.checkpoint.policy import (
        RoomStep,
        RoomTried,
        checkpoint_allowed,
        learned_ratio,
        made_enough_room,
        next_step,
    )
    from schemas.events import (
        CheckpointFailed,
        CheckpointStarted,
        CheckpointStored,
        ErrorEvent,
        RecallFound,
        SessionStopped,
        TextDelta,
        TurnEnded,
        TurnStarted,
        tail_deltas,
    )
    from schemas.input_size import room_taken
    from schemas.messages import MessageType, ModelReply
    from schemas.session import TOO_LONG_MESSAGE, SessionPhase, TurnInProgress, TurnOutcome
    from schemas.vault.recall import RecallInput
    from schemas.vault.recall_rules import wants_recall
    from workflows.budget import BudgetGate, Gate
    from workflows.checkpoint import CheckpointChain, CheckpointOutcome
    from workflows.failures import failure_type, reason
    from workflows.inbox import Inbox
    from workflows.interrupt import Interrupter
    from workflows.observe import TurnObserver
    from workflows.options import MODEL_CALL
    from workflows.run import SessionRun
    from workflows.tools import CheckpointWhileWaiting, ToolRunner
    from workflows.transcript import Transcript

__all__ = ["MAX_OUTCOMES", "TOO_LONG_MESSAGE", "TurnEnd", "TurnState", "Turns"]


MAX_OUTCOMES = 64


class TurnEnd(Enum):
    """How a turn left the loop: ended (its callers answered), or carried over
    continue-as-new while a call of it waits on a person."""

    ENDED = "ended"
    CONTINUE_AS_NEW = "continue_as_new"


@dataclass
class TurnState:
    """What one turn knows; new each turn (and for a checkpoint asked for between turns)."""

    first_seq: int  # the turn's first input: a checkpoint keeps it and what follows
    checkpoint_failures: int = 0  # failed or too small checkpoints this turn
    memory_block: str = ""  # this turn's recall, searched by its first model call
    recall_failed: str | None = None  # why that search failed, said after the reply
    recalled: list[str] = field(default_factory=list)  # the vault paths it found
    progress: TurnInProgress | None = None  # what goes over continue-as-new mid-turn


class DelegationHooks(Protocol):
    """workflows.delegation's part in a model call (activities.delegate_ahead)."""

    ahead: dict[str, str]

    def step(self, answered: dict[int, TurnOutcome]) -> DelegationStep | None: ...

    def took(self, started_ahead: dict[str, str], told_parent: bool) -> None: ...

    async def settle_ahead(self) -> None: ...


class CallEnd(NamedTuple):
    """A model call's end: the reply (None when the turn must end), the error said to the
    user, and the last seq the model saw."""

    reply: ModelReply | None
    error: str | None
    upto: int
    # The inputs whose transcript the call queued with its reply (activities.vault.outbox);
    # None: the session appends them itself after the turn.
    queued: list[int] | None = None
    # Not sent, and a checkpoint made on its way reached a budget: the gate comes first.
    regate: bool = False


@dataclass
class _Call:
    """One model call's attempts: what they tried to make room, and what the first one
    carries (the messages folded into it, the recall)."""

    tried: RoomTried
    records: list[RecordInput]
    recall: RecallInput | None
    record_within: float
    called_at: datetime
    transcribe: list[int] | None = None  # the inputs the last attempt queued (MemoryStep)


class Turns:
    """Runs a session's turns. The durable part is `SessionState`; `turn` is this turn's."""

    def __init__(self, run: SessionRun, inbox: Inbox, tools: ToolRunner,
                 observer: TurnObserver, outcomes: dict[int, TurnOutcome]) -> None:
        self.run = run
        self.inbox = inbox
        self.tools = tools
        # memory_search leaves out the session's own entries from its live window on: the
        # window's start, or this turn's first input when a checkpoint carried it.
        tools.live_from_seq = lambda: min(run.state.window_start_seq, self.turn.first_seq)
        self.observer = observer
        self.outcomes = outcomes  # seq -> the turn that answered it (its callers wait)
        self.chain = CheckpointChain(run.state, self.memory_flush_failed)
        self.turn = TurnState(first_seq=run.state.next_seq)
        self.transcript = Transcript(run)
        self.budget = BudgetGate(run)  # workflows.budget: spend, and the pause at a limit
        self.interrupts = Interrupter(run)  # workflows.interrupt: a stop asked mid-turn
        self.delegation: DelegationHooks | None = None  # workflows.delegation's part
        tools.stopping = self.budget.stopping = lambda: self.interrupts.requested

    # ----- a turn ------------------------------------------------------------------------

    async def run_turn(self) -> TurnEnd:
        """The next turn, or the one carried over continue-as-new (at its waiting call)."""
        state = self.run.state
        carried, state.turn_in_progress = state.turn_in_progress, None
        progress = self._start(carried)
        if carried is None:
            await self.tools.ensure_mcp()
        else:  # carried over continue-as-new: the waiting call and the rest of its reply
            self.turn.first_seq, self.turn.memory_block = carried.first_seq, carried.memory_block
            if not await self._run_tools(carried.reply, carried.next_call):
                return TurnEnd.CONTINUE_AS_NEW
        ended = await self._converse(progress, first=carried is None)
        if ended is None:
            return TurnEnd.CONTINUE_AS_NEW
        await self._end(progress, *ended)
        return TurnEnd.ENDED

    def _start(self, carried: TurnInProgress | None) -> TurnInProgress:
        state = self.run.state
        self.run.phase = SessionPhase.RUNNING
        first_seq = self.turn.first_seq
        if carried is None:
            state.turn += 1
            first = [p.seq for p in state.pending if p.seq <= state.recorded_upto]
            first_seq = min(first) if first else state.next_seq
            self.run.events.emit(TurnStarted, turn=state.turn, input_seqs=first)
            self.interrupts.start_turn()
        self.budget.start_turn()
        self.observer.turn_started()
        # The turn's progress, kept where a continue-as-new during an approval wait finds it.
        progress = carried or TurnInProgress(
            reply=ModelReply(seq=0, stop_reason=None), next_call=0, first_seq=first_seq)
        self.turn = TurnState(first_seq=first_seq, progress=progress)
        return progress

    async def _converse(self, progress: TurnInProgress, *, first: bool,
                        ) -> tuple[ModelReply | None, str | None] | None:
        """Model calls and their tool calls until a reply without calls (or the rounds run
        out). None when the session continues as new with the turn."""
        state = self.run.state
        answered, transcribe = progress.answered, progress.transcribe
        last = progress.reply if progress.reply.seq else None
        while True:
            if not first and self.interrupts.requested:  # stopped: no call more
                return last, None
            # A pause records first what the call would have (a message asked while idle).
            gate = await self.budget.gate(self.inbox.record_unrecorded)
            if gate is Gate.CONTINUE_AS_NEW:  # the new run waits at this same call
                carried = last or progress.reply
                self._carry(carried, len(carried.tool_calls))
                return None
            if gate is Gate.END:
                return last, self.budget.ended_reason
            end = await self.call_model(state.recorded_upto, first=first)
            first = False
            if end.regate:  # a checkpoint's spend reached a budget: the gate first
                continue
            reply, error, upto, queued = end.reply, end.error, end.upto, end.queued
            taking = [p.seq for p in state.pending if p.seq <= upto]
            state.pending = [p for p in state.pending if p.seq not in taking]
            answered.extend(taking)
            transcribe.extend(s for s in taking if queued is None or s not in queued)
            if reply is None:
                return reply, error
            if reply.text.strip() and queued is None:
                transcribe.append(reply.seq)
            last = reply
            if reply.interrupted:
                return reply, None
            # A child its parent ended (or gave up on) asks the model no more.
            if state.ended and state.config.delegated is not None:
                return reply, error
            if reply.tool_calls and progress.rounds < state.config.max_tool_rounds_per_turn:
                progress.rounds += 1
                if not await self._run_tools(reply):
                    return None
                continue
            return reply, error

    async def _end(self, progress: TurnInProgress, reply: ModelReply | None,
                   error: str | None) -> None:
        """The turn's outcome to its callers, then what is written after the reply."""
        run, state = self.run, self.run.state
        chars = (reply.text_chars or len(reply.text)) if reply else 0
        outcome = TurnOutcome(
            turn=state.turn, input_seqs=progress.answered,
            reply_seq=reply.seq if reply else None, reply_text=reply.text if reply else "",
            reply_cut=chars > len(reply.text) if reply else False, reply_chars=chars,
            error=error, stopped_reason=state.stopped_reason,
            interrupted=self.interrupts.requested or bool(reply and reply.interrupted),
            spent=state.budget.turn_spent, stop_reason=reply.stop_reason if reply else None)
        run.events.emit(TurnEnded, turn=state.turn, reply_seq=outcome.reply_seq,
                        reply_chars=chars,
                        reply_preview=outcome.reply_text, error=error,
                        model=self.observer.model, context_tokens=state.context_tokens,
                        context_window=state.config.context_window,
                        checkpoint_threshold=run.window.threshold,
                        cached_tokens=self.observer.cached_tokens,
                        uncached_tokens=self.observer.input_tokens,
                        cache_ttl=state.cache_ttl_now().value,
                        stop_reason=outcome.stop_reason)
        self.observer.turn_ended(error=error)
        for seq in progress.answered:
            self.outcomes[seq] = outcome
        for old in sorted(self.outcomes)[:-MAX_OUTCOMES]:
            del self.outcomes[old]
        run.phase = run.settled_phase()
        run.publish_summary()
        # The caller has its reply; what is left is written after it.
        if self.turn.recall_failed:
            await run.record_notice(
                f"Long memory could not be searched this turn: {self.turn.recall_failed}")
        self.transcript.add(progress.transcribe, self.turn.recalled)

    # ----- tool calls and what their approval waits ask for -------------------------------

    async def _run_tools(self, reply: ModelReply, start: int = 0) -> bool:
        """Run `reply`'s calls from `start`, taking a checkpoint an approval wait asks for.
        False: the session continues as new with the turn (carried in the state)."""
        wait = await self.tools.run_calls(reply, start)
        if self.delegation is not None and self.delegation.ahead:
            await self.delegation.settle_ahead()
        while isinstance(wait, CheckpointWhileWaiting):
            await self.checkpoint_while_waiting(wait.before_seq)
            wait = await self.tools.resume()
        if wait is None:
            return True
        self._carry(wait.reply, wait.next_call)
        return False

    def _carry(self, reply: ModelReply, next_call: int) -> None:
        """The turn into the state, resumed by the next run at call `next_call` of `reply`."""
        assert self.turn.progress is not None  # only a running turn's calls wait
        self.run.state.turn_in_progress = self.turn.progress.model_copy(update={
            "reply": reply, "next_call": next_call, "memory_block": self.turn.memory_block})

    async def checkpoint_while_waiting(self, before_seq: int) -> None:
        """A requested checkpoint in the middle of a turn that waits on an approval. It
        condenses only what came before the waiting call's assistant message (`before_seq`):
        the call, its wait line and its coming result stay in the window together, so the
        result is never cut off from its call."""
        state = self.run.state
        try:
            self.turn.checkpoint_failures = 0
            if before_seq - 1 >= state.window_start_seq:
                await self.checkpoint(before_seq - 1)
        finally:
            state.checkpoint_requested = False
            self.run.phase = SessionPhase.AWAITING_APPROVAL
            self.run.publish_summary()

    async def requested_checkpoint(self) -> None:
        """A checkpoint asked for between turns, over the whole record."""
        state = self.run.state
        try:
            if state.recorded_upto >= state.window_start_seq:
                self.turn = TurnState(first_seq=state.next_seq)
                await self.checkpoint(state.recorded_upto)
        finally:
            state.checkpoint_requested = False
            self.run.phase = self.run.settled_phase()
            self.run.publish_summary()

    # ----- a model call ------------------------------------------------------------------

    async def call_model(self, upto: int, *, first: bool = False) -> CallEnd:
        """One model call, walking the room-making ladder first when the request does not
        fit. The turn's `first` call also records the messages folded into it and searches
        long memory."""
        state = self.run.state
        call = _Call(tried=RoomTried(), records=self.inbox.folded(),
                     recall=self._recall_request() if first else None,
                     # A folded message's caller waits at most about the record timeout:
                     # half of it for the call's record step, the rest for the ordinary
                     # record after it.
                     record_within=state.config.record_timeout_s / 2,
                     called_at=workflow.now())
        while True:
            seq = state.allocate_seq()
            try:
                self.interrupts.calling = seq
                ttl = state.call_asked(workflow.now())  # its cache lifetime
                data = self._model_call_input(seq, upto, call, ttl)
                call.transcribe = data.memory.transcribe
                result: ModelCallResult = await workflow.execute_activity_method(
                    SessionActivities.call_model, data, **MODEL_CALL)
            except ActivityError as err:
                self.interrupts.calling = None
                failed = await self._call_failed(err, seq, upto, call)
                if failed is None:
                    continue
                return failed
            self.interrupts.calling = None
            ended = await self._answered(result, seq, upto, call)
            if ended is not None:
                return ended
            if self.budget.reached_by_room():  # the call waits for the gate
                return CallEnd(None, None, upto, regate=True)
            upto = state.recorded_upto

    def _model_call_input(self, seq: int, upto: int, call: _Call,
                          ttl: str) -> ModelCallInput:
        """The model call's input: the one place it is built."""
        run, state, turn = self.run, self.run.state, self.turn
        return ModelCallInput(
            session_id=state.session_id, turn=state.turn, reply_seq=seq,
            span=WindowSpan(start_seq=state.window_start_seq, upto_seq=upto,
                            checkpoint_id=state.checkpoint_id, keep_recent_seq=turn.first_seq),
            ask=ModelAsk(model=state.config.model, window=run.window,
                         usage_ratio=state.usage_ratio, agent=state.config.agent,
                         mcp_tools=state.mcp_tools, cache_ttl=ttl),
            room=RoomSteps(asked=call.tried.asked, cut_newest_output=call.tried.output_cut),
            memory=MemoryStep(scope=state.config.memory_scope, block=turn.memory_block,
                              recall=call.recall, transcribe=self._transcribe(upto)),
            first=RecordStep(inputs=call.records, within_s=call.record_within),
            delegation=self.delegation.step(self.outcomes) if self.delegation else None)

    def _transcribe(self, upto: int) -> list[int] | None:
        """The inputs a call up to `upto` answers, for it to queue their transcript with its
        reply (none after the reply: no activity, no workflow task). None: no long memory.
        No patch is needed: what the session does after the call follows the call's
        recorded result (`ModelCallResult.transcribed`), which a history from before lacks,
        so it replays as it ran."""
        state = self.run.state
        if state.config.memory_scope is None:
            return None
        return [p.seq for p in state.pending if p.seq <= upto]

    async def _call_failed(self, err: ActivityError, seq: int, upto: int,
                           call: _Call) -> CallEnd | None:
        """A model call that gave up. None: call again (the call's record step failed and
        the ordinary record took the messages)."""
        state = self.run.state
        if call.records:  # did the call record them? The ordinary record makes sure.
            call.records = []
            not_recorded = failure_type(err) == INPUT_NOT_RECORDED
            spent = (workflow.now() - call.called_at).total_seconds()
            await self.inbox.record_unrecorded(  # a caller still waits: what is left
                max(1, int(state.config.record_timeout_s - spent))
                if not_recorded else None)
            if not_recorded:  # the model was not asked
                await self.inbox.fence(seq, "No reply here: the record did not take the "
                                            f"turn's message at first ({reason(err)}).")
                if not any(p.seq <= upto for p in state.pending):
                    return CallEnd(None, None, upto)  # lost (its caller heard), or a retry
                return None
        message = f"The model call failed: {reason(err)}"
        self.run.last_error = message
        self.run.events.emit(ErrorEvent, turn=state.turn, message=message, where="model")
        await self.inbox.fence(seq, message)  # the notice, where a late reply would go
        return CallEnd(None, message, upto)

    async def _answered(self, result: ModelCallResult, seq: int, upto: int,
                        call: _Call) -> CallEnd | None:
        """A model call that answered: its reply, or a request that did not fit and the
        ladder's next rung taken (None: call again)."""
        state = self.run.state
        state.settle_seq(seq)
        if self.delegation is not None:
            self.delegation.took(result.started_ahead, result.told_parent)
        for record, inserted in zip(call.records, result.recorded, strict=True):
            del self.inbox.unrecorded[record.seq]
            self.inbox.recorded(record, inserted)
        if any(r.type != MessageType.TOOL_RESULT for r in call.records) \
                and not any(p.seq <= upto for p in state.pending):
            return CallEnd(None, None, upto)  # a caller's retry of an input recorded before
        call.records = []
        if call.recall is not None:
            self._took_recall(result)
            call.recall = None  # searched once a turn; later calls send its block
        if result.stream_tail is not None:
            tail = result.stream_tail
            for index, start, text in tail_deltas(tail, result.reply.text if result.reply
                                                  else ""):
                self.run.events.emit(TextDelta, turn=state.turn, reply_seq=seq,
                                     attempt=tail.attempt, index=index, start=start, text=text)
        if result.reply is not None:
            self._account(result, result.reply)
            await self.budget.charge(spend_of(result.reply.usage, result.reply.cost_usd))
            self.observer.model_called(result.reply)
            if result.replaced:
                await self.run.record_notice("The model's output held characters the "
                                             "record cannot store: "
                                             + "; ".join(result.replaced))
            queued = call.transcribe if result.transcribed else None
            return CallEnd(result.reply, None, upto, queued)
        state.context_tokens = result.estimated_tokens
        if result.refused is not None:  # the API's count: the estimate corrected at once
            counted = result.refused.counted(self.run.window.hard_limit)
            state.usage_ratio = learned_ratio(state.usage_ratio, counted,
                                              result.refused.estimate)
            state.context_tokens = counted
            self.observer.refused_as_too_long(counted)
        if not await self._make_room(result, call.tried, upto):
            await self._stop_too_long(result)
            return CallEnd(None, TOO_LONG_MESSAGE, upto)
        return None

    def _account(self, result: ModelCallResult, reply: ModelReply) -> None:
        """The reply's usage: the estimate's ratio to it, and the context it leaves."""
        state = self.run.state
        actual = reply.usage.context_tokens
        state.usage_ratio = learned_ratio(state.usage_ratio, actual, result.estimated_tokens)
        state.last_usage_tokens = actual
        state.call_billed(reply.usage.input_tokens + reply.usage.cache_creation_input_tokens)
        state.cache_ttl_refused |= result.cache_ttl_refused
        state.answered_by = reply.model or state.answered_by
        state.context_tokens = (actual or result.estimated_tokens) + reply.reply_tokens

    async def _stop_too_long(self, result: ModelCallResult) -> None:
        """Nothing more can be moved out of a request that cannot be sent: stopped."""
        run = self.run
        run.state.stopped_reason = TOO_LONG_MESSAGE
        run.events.emit(SessionStopped, turn=run.state.turn, reason=TOO_LONG_MESSAGE)
        await run.record_notice(f"{TOO_LONG_MESSAGE} " + room_taken(
            result.estimated_tokens, run.window.hard_limit, result.fixed_tokens, result.refused,
            result.largest))
        run.phase = SessionPhase.STOPPED

    # ----- long memory -------------------------------------------------------------------

    def _recall_request(self) -> RecallInput | None:
        """This turn's search of long memory, with the newest input's words; None when the
        session has none or the input has no content words ("continue", "ok")."""
        state = self.run.state
        scope = state.config.memory_scope
        ready = [p for p in state.pending if p.seq <= state.recorded_upto]
        query = ready[-1].query if ready else ""
        if scope is None or not query.strip() or not wants_recall(query):
            return None
        return RecallInput(session_id=state.session_id, query=query, scope=scope)

    def _took_recall(self, result: ModelCallResult) -> None:
        """Adopt what the turn's first call found in long memory, or say why it could not
        search (the turn goes on without; a notice follows the reply)."""
        run = self.run
        if result.recall_failed:
            message = f"long memory could not be searched: {result.recall_failed}"
            run.last_error = message
            self.turn.recall_failed = result.recall_failed
            run.events.emit(ErrorEvent, turn=run.state.turn, message=message, where="memory")
        elif result.recall is not None:
            self.turn.memory_block = result.recall.block
            if not result.transcribed:  # else their access is counted with the transcript
                self.turn.recalled = result.recall.sources
            if result.recall.hits:
                run.events.emit(RecallFound, turn=run.state.turn, hits=result.recall.hits,
                                sources=result.recall.sources)

    # ----- making room -------------------------------------------------------------------

    async def _make_room(self, result: ModelCallResult, tried: RoomTried, upto: int) -> bool:
        """Take the ladder's next rung for a request that was not sent. False: stop."""
        state = self.run.state
        step = next_step(result.fit, tried, checkpoint_allowed=checkpoint_allowed(
            self.turn.checkpoint_failures, state.recent_savings,
            state.config.context_window))
        if step is RoomStep.CHECKPOINT:
            tried.checkpoint = True
            await self.checkpoint(upto)
        elif step is RoomStep.MOVE_EARLIEST_HALF:
            before = state.context_tokens
            moved = await self.chain.move_half(upto, self.turn.first_seq)
            if moved.error is not None:
                self.run.last_error = f"moving the earliest half failed: {moved.reason}"
            if moved.stored is None:
                tried.move_failed = True
            else:
                self.chain.adopt(moved)
                self._checkpoint_stored(moved, before)
        elif step is RoomStep.CUT_NEWEST_OUTPUT:
            tried.output_cut = True
        elif step is RoomStep.STOP:
            return False
        else:  # SEND: past the threshold, nothing more to try, and it still fits
            tried.send_as_is = True
        return True

    async def checkpoint(self, upto: int) -> None:
        """One model checkpoint; a failed or too small one counts against this turn."""
        run, state = self.run, self.run.state
        run.phase = SessionPhase.CHECKPOINTING
        before = state.context_tokens
        run.events.emit(CheckpointStarted, turn=state.turn, tokens_before=before,
                        threshold=run.window.threshold)
        with self.observer.checkpoint_trace():
            outcome = await self.chain.checkpoint(upto, self.turn.first_seq)
        await self.budget.charge(outcome.spent,  # its rounds and flush, stored or not
                                 in_turn=self.turn.progress is not None)
        if outcome.error is not None:  # a step gave up: the session keeps its checkpoint
            run.last_error = f"checkpoint failed: {outcome.reason}"
            await run.record_notice(f"A checkpoint failed: {outcome.reason}")
        run.phase = SessionPhase.RUNNING
        if outcome.stored is not None:
            self.chain.adopt(outcome)
            self._checkpoint_stored(outcome, before)
        else:
            run.events.emit(CheckpointFailed, turn=state.turn, reason=outcome.reason)
            self.observer.checkpoint_failed(outcome, before)
        if outcome.stored is None or not made_enough_room(
                outcome.stored.window_tokens_after, run.window):
            self.turn.checkpoint_failures += 1

    async def memory_flush_failed(self, checkpoint_no: int, err: ActivityError) -> None:
        """A memory flush gave up: the checkpoint goes on; status, the event stream and the
        record say what was not flushed."""
        run = self.run
        message = f"Memory flush failed before checkpoint {checkpoint_no}: {reason(err)}"
        run.last_error = message
        run.events.emit(ErrorEvent, turn=run.state.turn, message=message, where="memory")
        await run.record_notice(message)

    def _checkpoint_stored(self, outcome: CheckpointOutcome, before: int) -> None:
        """The stored checkpoint's event and log line (the session has adopted it)."""
        stored = outcome.stored
        assert stored is not None
        self.run.events.emit(CheckpointStored, turn=self.run.state.turn, kind=outcome.kind,
                             checkpoint_id=stored.checkpoint_id, tokens_before=before,
                             tokens_after=stored.window_tokens_after,
                             fallbacks=stored.fallbacks)
        self.observer.checkpoint_stored(outcome, before)
