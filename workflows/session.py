"""SessionWorkflow: one long-running agent session.

The workflow holds small state (sequence pointers, counters, the input queue, the current
mind / memo / now for queries); the conversation lives in PostgreSQL and every activity
loads what it needs by reference. Inputs are numbered here, in the order their handlers
ran, so every replay numbers them the same.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.session import (
        ModelCallInput,
        ModelCallResult,
        RecordInput,
        SessionActivities,
        ToolInput,
    )
    from activities.vault.turn import MemoryActivities, RecallInput, TranscriptInput
    from schemas.budgets import checkpoint_threshold
    from schemas.messages import (
        HarnessKind,
        MessageType,
        ModelReply,
        agent_run_source_line,
        callback_source_line,
        task_source_line,
        user_display_prefix,
        watch_source_line,
    )
    from schemas.session import (
        SESSION_WORKFLOW,
        AgentRunInput,
        AwaitReply,
        CallbackInput,
        MessageAccepted,
        PendingInput,
        Rejection,
        SessionInput,
        SessionPhase,
        SessionState,
        SessionStatus,
        TaskInput,
        TurnOutcome,
        UserMessage,
        WatchInput,
    )
    from schemas.tokens import count_tokens
    from workflows.checkpoint import CheckpointChain

TOO_LONG_MESSAGE = (
    "This conversation has grown too long to continue reliably. "
    "Start a new session with /new."
)

RECORD_TIMEOUT = timedelta(seconds=30)
DB_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
)
MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
)
MAX_OUTCOMES = 64
KEPT_OUTCOMES = 16  # carried over continue-as-new
RECALL_QUERY_CHARS = 500
# Long memory helps a turn but must never hold one up: a few tries, then go on without it.
MEMORY_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3)
MEMORY_PATCH = "long-memory-v1"
REPLY_FIRST_PATCH = "reply-before-transcript"
CAN_FIRST_PATCH = "continue-as-new-before-next-turn"
# The model activity beats every 5 s: four missed beats mean its worker is gone.
MODEL_HEARTBEAT = timedelta(seconds=20)


def _rejected(reason: str) -> ApplicationError:
    return ApplicationError(reason, type=Rejection.MESSAGE_REJECTED, non_retryable=True)


@workflow.defn(name=SESSION_WORKFLOW)
class SessionWorkflow:
    @workflow.init
    def __init__(self, input: SessionInput) -> None:
        self.s: SessionState = input.state or SessionState(
            session_id=input.session_id, config=input.config
        )
        cfg = self.s.config
        self.threshold = checkpoint_threshold(
            cfg.context_window, cfg.max_output_tokens, cfg.price_step_tokens
        )
        self.hard_limit = cfg.context_window - cfg.max_output_tokens
        self.phase = SessionPhase.STOPPED if self.s.stopped_reason else SessionPhase.IDLE
        self.last_error: str | None = None
        self.outcomes: dict[int, TurnOutcome] = {}
        for kept in self.s.recent_outcomes:
            outcome = TurnOutcome.model_validate(kept)
            for seq in outcome.input_seqs:
                self.outcomes[seq] = outcome
        self.continuing = False
        self.turn_first_seq = self.s.next_seq
        self.checkpoint_failures_this_turn = 0
        self.chain = CheckpointChain(self)
        self.memory_block = ""

    # ----- sequence numbers -------------------------------------------------------------

    def allocate_seq(self) -> int:
        seq = self.s.next_seq
        self.s.next_seq += 1
        return seq

    def settle_seq(self, seq: int) -> None:
        """Mark a seq recorded (or abandoned): the window may read up to the settled prefix."""
        if seq <= self.s.recorded_upto:
            return
        pending = set(self.s.recorded_seqs)
        pending.add(seq)
        while self.s.recorded_upto + 1 in pending:
            self.s.recorded_upto += 1
            pending.discard(self.s.recorded_upto)
        self.s.recorded_seqs = sorted(pending)

    # ----- inputs -----------------------------------------------------------------------

    async def _record_input(
        self, kind: str, type_: MessageType, text: str, source_line: str | None,
        input_id: str | None, *, patient: bool,
    ) -> MessageAccepted:
        seq = self.allocate_seq()
        input_id = input_id or f"{kind}-{workflow.uuid4()}"
        try:
            inserted = await workflow.execute_activity_method(
                SessionActivities.record_input,
                RecordInput(session_id=self.s.session_id, seq=seq, input_id=input_id,
                            type=type_, text=text, source_line=source_line,
                            user_name=self.s.config.user_name, turn=self.s.turn + 1),
                start_to_close_timeout=RECORD_TIMEOUT,
                # A caller waits on a user's message, so give up in time and say so; a
                # background input has nobody waiting and must not be lost.
                schedule_to_close_timeout=None if patient else timedelta(
                    seconds=self.s.config.record_timeout_s),
                retry_policy=DB_RETRY,
            )
        except ActivityError as err:
            self.settle_seq(seq)
            raise ApplicationError(
                f"the message could not be recorded ({err.cause or err}); nothing was kept, "
                "send it again", type=Rejection.RECORD_FAILED,
            ) from err
        self.settle_seq(seq)
        if not inserted.duplicate:
            self.s.pending.append(PendingInput(seq=inserted.seq, kind=kind,
                                               query=text[:RECALL_QUERY_CHARS]))
            self.s.context_tokens += inserted.token_count
        return MessageAccepted(session_id=self.s.session_id, seq=inserted.seq, input_id=input_id)

    @workflow.update
    async def send_message(self, message: UserMessage) -> MessageAccepted:
        prefix = user_display_prefix(message.text, self.s.config.user_name)
        return await self._record_input("user", MessageType.USER, message.text, prefix,
                                        message.input_id, patient=False)

    @send_message.validator
    def validate_message(self, message: UserMessage) -> None:
        if self.s.stopped_reason:
            raise ApplicationError(f"this session has stopped: {self.s.stopped_reason}",
                                   type=Rejection.SESSION_STOPPED, non_retryable=True)
        if not message.text.strip():
            raise _rejected("the message is empty")
        limit = self.s.config.max_message_chars
        if len(message.text) > limit:
            raise _rejected(
                f"the message has {len(message.text)} characters; the limit is {limit}. "
                "Put long material in a file in the workspace and refer to it."
            )
        # A message must leave room for the rest of the context and the reply, or no
        # checkpoint could ever make it fit. Counting is pure and deterministic.
        token_limit = self.hard_limit // 2
        tokens = count_tokens(message.text)
        if tokens > token_limit:
            raise _rejected(
                f"the message has {tokens} tokens; on this model a message may have at most "
                f"{token_limit}. Put long material in a file in the workspace and refer to it."
            )

    async def _background(self, kind: HarnessKind, source_line: str, text: str,
                          input_id: str | None) -> None:
        if self.s.stopped_reason:
            workflow.logger.warning("input %s dropped: session stopped", kind)
            return
        try:
            await self._record_input(kind.value, MessageType.HARNESS, text, source_line,
                                     input_id, patient=True)
        except ApplicationError as err:
            # A signal has no caller to tell; failing the workflow would lose the session.
            self.last_error = str(err)
            workflow.logger.error("background input not recorded: %s", err)

    @workflow.signal
    async def watch(self, data: WatchInput) -> None:
        await self._background(HarnessKind.WATCH, watch_source_line(data.watch_id, data.name),
                               data.text, data.input_id)

    @workflow.signal
    async def task(self, data: TaskInput) -> None:
        await self._background(HarnessKind.TASK, task_source_line(data.task_id, data.name),
                               data.text, data.input_id)

    @workflow.signal
    async def agent_run(self, data: AgentRunInput) -> None:
        await self._background(HarnessKind.AGENT_RUN,
                               agent_run_source_line(data.run_id, data.from_session),
                               data.text, data.input_id)

    @workflow.signal
    async def callback(self, data: CallbackInput) -> None:
        await self._background(HarnessKind.CALLBACK,
                               callback_source_line(data.run_id, data.from_session),
                               data.text, data.input_id)

    @workflow.update
    async def await_reply(self, data: AwaitReply) -> TurnOutcome:
        """Wait until the turn that answers input `seq` has ended."""
        await workflow.wait_condition(
            lambda: data.seq in self.outcomes or self.s.stopped_reason is not None
            or self.continuing
            or (data.seq <= self.s.recorded_upto
                and all(p.seq != data.seq for p in self.s.pending)
                and self.phase == SessionPhase.IDLE)
        )
        if data.seq not in self.outcomes and self.continuing:
            # Continue-as-new waits for every handler: this one must not hold it up.
            return TurnOutcome(turn=self.s.turn, input_seqs=[data.seq], retry=True)
        return self.outcomes.get(data.seq) or TurnOutcome(
            turn=self.s.turn, input_seqs=[data.seq], stopped_reason=self.s.stopped_reason,
            error=None if self.s.stopped_reason else "that input was answered earlier")

    @await_reply.validator
    def validate_await(self, data: AwaitReply) -> None:
        if data.seq < 1 or data.seq >= self.s.next_seq:
            raise ApplicationError(f"no input #{data.seq} in this session",
                                   type=Rejection.NO_SUCH_INPUT, non_retryable=True)

    # ----- queries ----------------------------------------------------------------------

    @workflow.query
    def status(self) -> SessionStatus:
        return SessionStatus(
            session_id=self.s.session_id, phase=self.phase, turn=self.s.turn,
            context_tokens=self.s.context_tokens, context_window=self.s.config.context_window,
            checkpoint_threshold=self.threshold, checkpoint_count=self.s.checkpoint_count,
            pending_inputs=len(self.s.pending), window_start_seq=self.s.window_start_seq,
            last_seq=self.s.recorded_upto, model=self.s.config.model,
            stopped_reason=self.s.stopped_reason, last_error=self.last_error,
        )

    @workflow.query
    def mind(self) -> str:
        return self.s.mind_text

    @workflow.query
    def memo(self) -> str:
        return self.s.memo_text

    @workflow.query
    def now(self) -> str:
        return self.s.now_text

    # ----- the loop ---------------------------------------------------------------------

    def _ready(self) -> bool:
        return self.s.stopped_reason is None and any(
            p.seq <= self.s.recorded_upto for p in self.s.pending)

    def _should_continue_as_new(self) -> bool:
        limit = self.s.config.continue_as_new_after_events
        info = workflow.info()
        return info.is_continue_as_new_suggested() or (
            limit > 0 and info.get_current_history_length() >= limit)

    @workflow.run
    async def run(self, input: SessionInput) -> SessionStatus:
        while self.s.stopped_reason is None:
            await workflow.wait_condition(
                lambda: self._ready() or self._should_continue_as_new()
                or self.s.stopped_reason is not None)
            # Under a steady stream of inputs there is always a next turn: continue-as-new
            # comes first, carrying the queue, or the history would grow without bound.
            # (Histories from before this rule answered every waiting input first.)
            can_first = self._should_continue_as_new() and self.s.stopped_reason is None and (
                not self._ready() or workflow.patched(CAN_FIRST_PATCH))
            if not can_first:
                if self._ready():
                    await self._run_turn()
                    continue
                if self.s.stopped_reason is not None:
                    break
            self.continuing = True
            await workflow.wait_condition(workflow.all_handlers_finished)
            self.continuing = False
            if self._ready() and not workflow.patched(CAN_FIRST_PATCH):
                continue  # an input arrived while handlers finished: answer it first
            self.s.run_count += 1
            distinct = {id(o): o for o in self.outcomes.values()}.values()
            kept = sorted(distinct, key=lambda o: o.turn)[-KEPT_OUTCOMES:]
            self.s.recent_outcomes = [o.model_dump() for o in kept]
            workflow.continue_as_new(SessionInput(
                session_id=self.s.session_id, config=self.s.config, state=self.s))
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    async def _run_turn(self) -> None:
        self.s.turn += 1
        self.phase = SessionPhase.RUNNING
        self.checkpoint_failures_this_turn = 0
        first = [p.seq for p in self.s.pending if p.seq <= self.s.recorded_upto]
        self.turn_first_seq = min(first) if first else self.s.next_seq
        answered: list[int] = []
        reply: ModelReply | None = None
        error: str | None = None
        rounds = 0
        memory = workflow.patched(MEMORY_PATCH)
        self.memory_block = await self._recall() if memory else ""
        transcribe: list[int] = []
        while True:
            reply, error, upto = await self._call_model(self.s.recorded_upto)
            taking = [p.seq for p in self.s.pending if p.seq <= upto]
            self.s.pending = [p for p in self.s.pending if p.seq not in taking]
            answered.extend(taking)
            transcribe.extend(taking)
            if reply is None:
                break
            if reply.text.strip():
                transcribe.append(reply.seq)
            if reply.tool_calls and rounds < self.s.config.max_tool_rounds_per_turn:
                rounds += 1
                await self._run_tools(reply)
                continue
            break
        outcome = TurnOutcome(
            turn=self.s.turn, input_seqs=answered,
            reply_seq=reply.seq if reply else None, reply_text=reply.text if reply else "",
            error=error, stopped_reason=self.s.stopped_reason)
        # The caller gets its reply before the transcript is written (histories recorded
        # before this change wrote the transcript first).
        reply_first = workflow.patched(REPLY_FIRST_PATCH)
        if memory and not reply_first:
            await self._transcribe(transcribe)
        for seq in answered:
            self.outcomes[seq] = outcome
        for old in sorted(self.outcomes)[:-MAX_OUTCOMES]:
            del self.outcomes[old]
        self.phase = SessionPhase.STOPPED if self.s.stopped_reason else SessionPhase.IDLE
        if memory and reply_first:
            await self._transcribe(transcribe)

    async def _recall(self) -> str:
        """Long memory for this turn, fenced: searched once, with the newest input's words."""
        ready = [p for p in self.s.pending if p.seq <= self.s.recorded_upto]
        query = ready[-1].query if ready else ""
        if not query.strip():
            return ""
        try:
            found = await workflow.execute_activity_method(
                MemoryActivities.recall_memory,
                RecallInput(session_id=self.s.session_id, query=query),
                start_to_close_timeout=timedelta(seconds=30), retry_policy=MEMORY_RETRY)
        except ActivityError as err:
            workflow.logger.warning("recall skipped: %s", err.cause or err)
            return ""
        return found.block

    async def _transcribe(self, seqs: list[int]) -> None:
        """Append this turn's inputs and replies to the vault's daily transcript."""
        for seq in seqs:
            try:
                await workflow.execute_activity_method(
                    MemoryActivities.append_transcript,
                    TranscriptInput(session_id=self.s.session_id, seq=seq),
                    start_to_close_timeout=timedelta(seconds=30), retry_policy=MEMORY_RETRY)
            except ActivityError as err:
                # The record keeps the message; the nightly rollup reads the record too.
                workflow.logger.warning("transcript of #%d skipped: %s", seq, err.cause or err)

    async def _run_tools(self, reply: ModelReply) -> None:
        for call in reply.tool_calls:
            seq = self.allocate_seq()
            try:
                outcome = await workflow.execute_activity_method(
                    SessionActivities.run_tool,
                    ToolInput(session_id=self.s.session_id, turn=self.s.turn,
                              assistant_seq=reply.seq, tool_use_id=call.id, result_seq=seq,
                              upto_seq=self.s.recorded_upto),
                    start_to_close_timeout=timedelta(seconds=60),
                    retry_policy=DB_RETRY,
                )
                self.s.context_tokens += outcome.token_count
            except ActivityError as err:
                # The model gets an error result for this call from context assembly.
                self.last_error = f"tool {call.name} failed: {err.cause or err}"
            self.settle_seq(seq)

    async def _call_model(self, upto: int) -> tuple[ModelReply | None, str | None, int]:
        """One model call, making room first when needed. Returns the reply (None when the
        turn must end), the error said to the user, and the last seq the model saw."""
        check_threshold = True
        cut_output = False
        while True:
            seq = self.allocate_seq()
            try:
                result: ModelCallResult = await workflow.execute_activity_method(
                    SessionActivities.call_model,
                    ModelCallInput(
                        session_id=self.s.session_id, turn=self.s.turn, reply_seq=seq,
                        window_start_seq=self.s.window_start_seq, upto_seq=upto,
                        checkpoint_id=self.s.checkpoint_id, model=self.s.config.model,
                        max_output_tokens=self.s.config.max_output_tokens,
                        threshold=self.threshold, hard_limit=self.hard_limit,
                        usage_ratio=self.s.usage_ratio, check_threshold=check_threshold,
                        cut_newest_output=cut_output, memory_block=self.memory_block,
                        keep_recent_seq=self.turn_first_seq),
                    start_to_close_timeout=timedelta(minutes=10),
                    schedule_to_close_timeout=timedelta(minutes=30),
                    heartbeat_timeout=MODEL_HEARTBEAT,
                    retry_policy=MODEL_RETRY,
                )
            except ActivityError as err:
                self.settle_seq(seq)
                message = f"The model call failed: {err.cause or err}"
                self.last_error = message
                await self.record_notice(message)
                return None, message, upto
            self.settle_seq(seq)
            if result.reply is not None:
                self._account(result)
                return result.reply, None, upto
            self.s.context_tokens = result.estimated_tokens
            room = await self._make_room(result, upto)
            if room:
                check_threshold = False
            elif not cut_output:
                cut_output = True
                check_threshold = False
            else:
                await self._stop_too_long()
                return None, TOO_LONG_MESSAGE, upto
            upto = self.s.recorded_upto

    def _account(self, result: ModelCallResult) -> None:
        reply = result.reply
        assert reply is not None
        actual = reply.usage.context_tokens
        if actual and result.estimated_tokens:
            ratio = actual / result.estimated_tokens
            self.s.usage_ratio = min(2.0, max(0.5, ratio * self.s.usage_ratio))
        self.s.last_usage_tokens = actual
        self.s.context_tokens = (actual or result.estimated_tokens) + reply.reply_tokens

    async def _make_room(self, result: ModelCallResult, upto: int) -> bool:
        """Make room for the next request. False when nothing more can move out."""
        thrash = self.chain.skip_for_thrash()
        if thrash:
            workflow.logger.info("checkpoint skipped: the last ones saved little (%s tokens)",
                                 self.s.recent_savings)
        if self.checkpoint_failures_this_turn < 2 and not thrash:
            self.phase = SessionPhase.CHECKPOINTING
            made = await self.chain.checkpoint(upto, self.turn_first_seq)
            self.phase = SessionPhase.RUNNING
            if made:
                return True
            self.checkpoint_failures_this_turn += 1
        if not result.cannot_fit:
            return True  # a failed checkpoint changes nothing: a request that fits is sent
        return await self.chain.move_half(upto, self.turn_first_seq)

    async def record_notice(self, text: str) -> None:
        seq = self.allocate_seq()
        try:
            await workflow.execute_activity_method(
                SessionActivities.record_input,
                RecordInput(session_id=self.s.session_id, seq=seq, input_id=f"notice-{seq}",
                            type=MessageType.NOTICE, text=text, turn=self.s.turn),
                start_to_close_timeout=RECORD_TIMEOUT, retry_policy=DB_RETRY,
                schedule_to_close_timeout=timedelta(minutes=5))
        except ActivityError as err:
            workflow.logger.error("notice not recorded: %s", err)
        self.settle_seq(seq)

    async def _stop_too_long(self) -> None:
        self.s.stopped_reason = TOO_LONG_MESSAGE
        await self.record_notice(TOO_LONG_MESSAGE)
        self.phase = SessionPhase.STOPPED
