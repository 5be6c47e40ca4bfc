"""SessionWorkflow: one long-running agent session.

The workflow holds small state (sequence pointers, counters, the input queue, the current
mind / memo / now for queries); the conversation lives in PostgreSQL and every activity
loads what it needs by reference. Inputs are numbered here, in the order their handlers
ran, so every replay numbers them the same. When a request would not fit, the session
walks the room-making ladder of `schemas.checkpoint.policy`, one rung at a time.

Every step ends, and its failure is recorded and survived: a seq the session gives up on
(an input not recorded in time, a failed model or tool call) is fenced with a notice
saying what was lost (`activities.record.fence_seq`), so nothing can fill it late, and it
settles only once fenced, so no window reads past it. Every input is either recorded byte
for byte or refused with a reason: a user's message by the validator (unstorable text,
over the payload limit), a background input by a notice (malformed, too large), and a
background input's unstorable characters are replaced and named. A session's identity is
its workflow id: a run whose input names another session writes nothing and fails.

A plain turn is one update (`Handler.ASK`; `send_message` + `await_reply` do the same in two
steps) and one activity before its reply. A message asked while the session is idle (no
turn running, nothing else waiting or being recorded) is numbered in the handler and
written to the record by the turn's first model call, before it reads the window; the same
call searches long memory (activities.session). When that call could not record it, the
ordinary record takes over (its retries, its deadline, RECORD_FAILED and the fence), so a
message is in the record before anything reads past it, or its caller is told it was not
kept; anything else that would read the record first (a checkpoint asked for,
continue-as-new, the session's end) records it the ordinary way before it reads. Any
other input is recorded by its own activity as it arrives (an ordinary one, so the server
ends an attempt that hangs). After the reply, the transcript is appended by one ordinary
activity in the background (the next turn does not wait for it). A failed recall or
transcript is said (`last_error`, an ErrorEvent where "memory", and for recall a notice in
the record), and never holds the turn up.
Continue-as-new happens between turns, or inside a turn whose tool call waits on a person
(the turn's progress goes with the state, `TurnInProgress`, and the new run resumes it at
the waiting call). A client's file calls are Updates that run one workspace activity each.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, NoReturn

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.checkpoint import StoreResult
    from activities.files import (
        FileActivities,
        ListFilesInput,
        PutFileInput,
        ReadFileInput,
    )
    from activities.record import FenceInput, Inserted
    from activities.session import (
        INPUT_NOT_RECORDED,
        ModelCallInput,
        ModelCallResult,
        RecordInput,
        SessionActivities,
    )
    from activities.tools import ToolError, workspace_path
    from activities.vault.turn import MemoryActivities, TranscriptsInput
    from schemas.agent import (
        AgentSpec,
        AgentSpecError,
        ApprovalDecision,
        DecisionRecorded,
        PendingApproval,
        check_spec,
        decision_problem,
    )
    from schemas.checkpoint.policy import (
        RoomStep,
        RoomTried,
        checkpoint_allowed,
        made_enough_room,
        next_step,
        remember_saving,
    )
    from schemas.events import (
        CheckpointFailed,
        CheckpointKind,
        CheckpointStarted,
        CheckpointStored,
        ErrorEvent,
        InputRecorded,
        RecallFound,
        SessionEnded,
        SessionStopped,
        TextDelta,
        TurnEnded,
        TurnStarted,
    )
    from schemas.files import (
        FILE_CALL_MAX_BYTES,
        FileData,
        FileEntry,
        FileVersion,
        ListFiles,
        PutFile,
        ReadFile,
        limit_text,
    )
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
        EndSession,
        Handler,
        MessageAccepted,
        PendingInput,
        Rejection,
        SessionInput,
        SessionPhase,
        SessionState,
        SessionStatus,
        TaskInput,
        TurnInProgress,
        TurnOutcome,
        UserMessage,
        WatchInput,
    )
    from schemas.text import make_storable, payload_problem, storable_problem
    from schemas.tokens import count_tokens
    from schemas.vault.recall import RecallInput
    from schemas.vault.recall_rules import wants_recall
    from schemas.vault.scope import scope_changed
    from workflows.checkpoint import CheckpointChain
    from workflows.events import SessionEvents
    from workflows.observe import TurnObserver
    from workflows.options import (
        FILE_CALL,
        MEMORY_TURN,
        MODEL_CALL,
        RECORD_BACKGROUND,
        RECORD_FENCE,
        RECORD_NOTICE,
        on_vault_queue,
        record_user_input,
    )
    from workflows.tools import BUILTIN_NAMES, ToolRunner

TOO_LONG_MESSAGE = (
    "This conversation has grown too long to continue reliably. "
    "Start a new session with /new."
)

MAX_OUTCOMES = 64
KEPT_OUTCOMES = 16  # carried over continue-as-new
RECALL_QUERY_CHARS = 500
NOTICE_REASON_CHARS = 500  # how much of an error a notice quotes

_SIGNAL_LABELS = {HarnessKind.WATCH: "Watch", HarnessKind.TASK: "Task",
                  HarnessKind.AGENT_RUN: "agent run", HarnessKind.CALLBACK: "callback"}


# A signal sent with no argument gets this (the SDK passes a payload as is only to a
# parameter typed exactly RawValue, so the default must be one).
NO_PAYLOAD = RawValue(Payload())



def _rejected(reason: str) -> ApplicationError:
    return ApplicationError(reason, type=Rejection.MESSAGE_REJECTED, non_retryable=True)


def _reason(err: BaseException) -> str:
    """An error as one storable line of bounded length, for a notice or `last_error`."""
    cause = err.cause if isinstance(err, ActivityError) and err.cause else err
    text = " ".join(str(cause).split()) or type(cause).__name__
    last = getattr(cause, "cause", None)  # a timeout's cause: the last attempt's failure
    if last is not None and str(last) and str(last) not in text:
        text += f" (last attempt: {' '.join(str(last).split())})"
    if len(text) > NOTICE_REASON_CHARS:
        text = text[:NOTICE_REASON_CHARS] + "..."
    return make_storable(text)[0]


def _failure_type(err: ActivityError) -> str | None:
    cause = err.cause
    return cause.type if isinstance(cause, ApplicationError) else None


def _lost_notice(lost: str, err: BaseException) -> str:
    return f"{lost} could not be recorded and was lost: {_reason(err)}"


def _decode_problem(err: Exception) -> str:
    """What was wrong with a signal's payload, naming fields, never quoting the payload."""
    if isinstance(err, ValidationError):
        parts = [f"{'.'.join(str(p) for p in e['loc']) or 'the payload'}: {e['msg']}"
                 for e in err.errors(include_input=False, include_url=False)[:5]]
        return "; ".join(parts)
    cause = err.__cause__ or err
    return make_storable(f"{type(cause).__name__}: {cause}"[:NOTICE_REASON_CHARS])[0]


@workflow.defn(name=SESSION_WORKFLOW)
class SessionWorkflow:
    @workflow.init
    def __init__(self, input: SessionInput) -> None:
        self.state: SessionState = input.state or SessionState(
            session_id=input.session_id, config=input.config
        )
        self.window = self.state.config.window()
        self.phase = (SessionPhase.STOPPED if self.state.stopped_reason
                      else SessionPhase.IDLE)
        self.last_error: str | None = None
        self.outcomes: dict[int, TurnOutcome] = {}
        for outcome in self.state.recent_outcomes:
            for seq in outcome.input_seqs:
                self.outcomes[seq] = outcome
        self.continuing = False
        self.turn_first_seq = self.state.next_seq
        self.checkpoint_failures_this_turn = 0
        self.chain = CheckpointChain(self.state, self.memory_flush_failed)
        self.memory_block = ""  # this turn's recall, searched by its first model call
        self.turn_recall_failed: str | None = None  # why that search failed, said after
        self.turn_recalled: list[str] = []  # the vault paths it found (their access counted)
        # Messages asked while idle, numbered but written by the turn's first model call
        # (`ask`); never carried over continue-as-new (written the ordinary way first).
        self.unrecorded: dict[int, RecordInput] = {}
        self.lost: dict[int, str] = {}  # seq -> why it was not recorded (its caller hears)
        self.redirects: dict[int, int] = {}  # seq -> the earlier seq of the same input id
        # The transcript, appended in the background after each reply (`_transcribe`).
        self.transcript_seqs: list[int] = []
        self.transcript_recalled: list[str] = []
        self.transcribing = False
        self.fencing: set[int] = set()  # seqs given up on whose tombstone is not written yet
        self.fence_tasks: set[asyncio.Task[None]] = set()
        workflow_id = workflow.info().workflow_id
        named = {input.session_id, self.state.session_id}
        self.refused: str | None = None if named == {workflow_id} else (
            f"this run names session {sorted(named - {workflow_id})[0]!r} but its workflow "
            f"id is {workflow_id!r}: a session's id is its workflow id; nothing was written")
        self.events = SessionEvents(input.session_id, input.events)
        self.observer = TurnObserver(self.state)
        self.tools = ToolRunner(self)
        self.progress: TurnInProgress | None = None  # the running turn's (`_run_turn`)
        if self.state.ended:
            self.phase = SessionPhase.ENDED
        elif self.state.turn_in_progress is not None:  # a call of it waits on a person
            self.phase = SessionPhase.AWAITING_APPROVAL

    # ----- inputs -----------------------------------------------------------------------

    async def _record_input(
        self, kind: str, type_: MessageType, text: str, source_line: str | None,
        input_id: str | None, *, patient: bool, lost: str,
    ) -> MessageAccepted:
        """Record one input at the next seq. When the record cannot take it in time, the
        seq is fenced with a notice saying `lost` and why, and RECORD_FAILED is raised."""
        state = self.state
        if self.fencing:
            # A retry of an input given up on must not meet its late twin: the fence first.
            try:
                await workflow.wait_condition(
                    lambda: not self.fencing,
                    timeout=None if patient else state.config.record_timeout_s)
            except TimeoutError:
                raise ApplicationError(
                    "the record is not answering (an earlier input is still not settled); "
                    "nothing was kept, send it again", type=Rejection.RECORD_FAILED,
                    non_retryable=True) from None
        seq = state.allocate_seq()
        input_id = input_id or f"{kind}-{workflow.uuid4()}"
        record = RecordInput(session_id=state.session_id, seq=seq, input_id=input_id,
                             type=type_, text=text, source_line=source_line,
                             user_name=state.config.user_name, turn=state.turn + 1)
        try:
            if patient:
                # A background input has nobody waiting and is tried for longer (an hour):
                # an ordinary activity, which may wait that long without holding a task.
                inserted = await workflow.execute_activity_method(
                    SessionActivities.record_input, record, **RECORD_BACKGROUND)
            else:
                # A caller waits on a user's message: given up in time. An ordinary activity,
                # not a local one: the server ends an attempt that hangs (a database going
                # down mid-connect was seen to hold a local attempt past every deadline,
                # and with it the caller's answer), and the workflow hears of it.
                inserted = await workflow.execute_activity_method(
                    SessionActivities.record_input, record,
                    **record_user_input(state.config.record_timeout_s))
        except ActivityError as err:
            if patient:  # nobody waits: the fence first
                await self.fence(seq, _lost_notice(lost, err))
            raise self._not_recorded(seq, lost, err, fence=not patient) from err
        state.settle_seq(seq)
        # A duplicate at this very seq is this activity's own retry (its first attempt wrote
        # the row and its answer was lost): a new input. At another seq it is a caller's
        # retry of an input recorded before.
        if not inserted.duplicate or inserted.seq == seq:
            self.events.emit(InputRecorded, turn=state.turn + 1, kind=kind, seq=inserted.seq,
                             source_line=source_line)
            state.pending.append(PendingInput(seq=inserted.seq, kind=kind,
                                              query=text[:RECALL_QUERY_CHARS]))
            state.context_tokens += inserted.token_count
        return MessageAccepted(session_id=state.session_id, seq=inserted.seq,
                               input_id=input_id)

    def _not_recorded(self, seq: int, lost: str, err: BaseException, *,
                      fence: bool = True) -> ApplicationError:
        """An input at `seq` given up on: said, fenced in the background unless `fence` is
        False (a caller hears now; the fence is written when the record answers), and the
        RECORD_FAILED its caller gets."""
        reason = _reason(err)
        self.last_error = f"{lost} could not be recorded: {reason}"
        if fence:
            self.fencing.add(seq)
            task = asyncio.create_task(self.fence(seq, _lost_notice(lost, err)))
            self.fence_tasks.add(task)
            task.add_done_callback(self.fence_tasks.discard)
        return ApplicationError(
            f"the message could not be recorded ({reason}); nothing was kept, send it again",
            type=Rejection.RECORD_FAILED, non_retryable=True)

    async def fence(self, seq: int, notice: str) -> None:
        """Give up on `seq` for good: a tombstone notice over it, then settle it."""
        self.fencing.add(seq)
        try:
            await workflow.execute_activity_method(
                SessionActivities.fence_seq,
                FenceInput(session_id=self.state.session_id, seq=seq,
                           text=make_storable(notice)[0], turn=self.state.turn,
                           user_name=self.state.config.user_name),
                **RECORD_FENCE)
        except ActivityError as err:
            self.last_error = f"seq {seq} could not be fenced: {_reason(err)}"
            workflow.logger.error("seq %d not fenced: %s", seq, err)
        finally:
            self.fencing.discard(seq)
            self.state.settle_seq(seq)

    def _lost_user(self) -> str:
        return f"A message from {make_storable(self.state.config.user_name)[0]}"

    async def _record_user(self, message: UserMessage) -> MessageAccepted:
        prefix = user_display_prefix(message.text, self.state.config.user_name)
        return await self._record_input(
            "user", MessageType.USER, message.text, prefix, message.input_id, patient=False,
            lost=self._lost_user())

    def _can_fold(self) -> bool:
        """A message may be recorded by its turn's first model call: the session is idle,
        nothing waits, nothing is being recorded or fenced, and nothing but that turn will
        read the record first (no checkpoint asked for, no continue-as-new due)."""
        state = self.state
        return (self.phase == SessionPhase.IDLE and not state.pending and not self.unrecorded
                and not self.fencing and state.recorded_upto == state.next_seq - 1
                and not state.checkpoint_requested and state.turn_in_progress is None
                and not self.continuing and not self.should_continue_as_new())

    def _fold_user(self, message: UserMessage) -> int:
        """Number a user's message and queue it for the next turn, which records it in its
        first model call. Said on the stream at once, as a recorded input is."""
        state = self.state
        prefix = user_display_prefix(message.text, state.config.user_name)
        seq = state.allocate_seq()
        self.unrecorded[seq] = RecordInput(
            session_id=state.session_id, seq=seq,
            input_id=message.input_id or f"user-{workflow.uuid4()}", type=MessageType.USER,
            text=message.text, source_line=prefix, user_name=state.config.user_name,
            turn=state.turn + 1)
        state.settle_seq(seq)  # nothing reads the record before the call that writes it
        state.pending.append(PendingInput(seq=seq, kind="user",
                                          query=message.text[:RECALL_QUERY_CHARS]))
        self.events.emit(InputRecorded, turn=state.turn + 1, kind="user", seq=seq,
                         source_line=prefix)
        return seq

    async def _record_unrecorded(self, within_s: int | None = None) -> None:
        """Write the messages still waiting for their turn's model call the ordinary way
        (before anything else reads the record), each in at most `within_s` (the session's
        record timeout). One that cannot be is lost: its caller hears RECORD_FAILED, its
        seq is fenced."""
        for seq in sorted(self.unrecorded):
            record = self.unrecorded.pop(seq)
            try:
                inserted = await workflow.execute_activity_method(
                    SessionActivities.record_input, record, **record_user_input(
                        within_s or self.state.config.record_timeout_s))
            except ActivityError as err:
                self._drop_pending(seq)
                self.lost[seq] = str(self._not_recorded(seq, self._lost_user(), err))
                continue
            self._recorded(record, inserted)

    def _recorded(self, record: RecordInput, inserted: Inserted) -> None:
        """A message written by the turn's call or the ordinary record. A duplicate at
        another seq is a caller's retry of an input recorded before: its caller waits for
        that one, and this seq stays empty (nothing was or will be written there)."""
        if inserted.duplicate and inserted.seq != record.seq:
            self._drop_pending(record.seq)
            self.redirects[record.seq] = inserted.seq
        else:
            self.state.context_tokens += inserted.token_count

    def _drop_pending(self, seq: int) -> None:
        self.state.pending = [p for p in self.state.pending if p.seq != seq]

    @workflow.update(name=Handler.SEND_MESSAGE)
    async def send_message(self, message: UserMessage) -> MessageAccepted:
        return await self._record_user(message)

    @workflow.update(name=Handler.ASK)
    async def ask(self, message: UserMessage) -> TurnOutcome:
        """A plain turn in one update: record the message, then wait for the turn that
        answers it (the refusals and RECORD_FAILED of send_message, the outcome of
        await_reply; `retry` with the input's seq when the session continues as new).
        While the session is idle the turn's first model call records it (`_fold_user`)."""
        if self._can_fold():
            return await self._outcome_of(self._fold_user(message))
        accepted = await self._record_user(message)
        return await self._outcome_of(accepted.seq)

    @ask.validator
    def validate_ask(self, message: UserMessage) -> None:
        self.validate_message(message)

    @send_message.validator
    def validate_message(self, message: UserMessage) -> None:
        """Refuse, before anything is written, what the session could never record exactly.
        The size checks come first and cost at most one pass over the text."""
        state = self.state
        if self.refused:
            raise _rejected(self.refused)
        if state.stopped_reason:
            raise ApplicationError(f"this session has stopped: {state.stopped_reason}",
                                   type=Rejection.SESSION_STOPPED, non_retryable=True)
        too_big = payload_problem(message.text)
        if too_big:
            raise _rejected(too_big)
        for what, value in (("message", message.text), ("input id", message.input_id or "")):
            problem = storable_problem(value)
            if problem:
                raise _rejected(f"the {what} cannot be recorded as written: {problem}. "
                                "Remove that character and send it again.")
        if not message.text.strip():
            raise _rejected("the message is empty")
        limit = state.config.max_message_chars
        if len(message.text) > limit:
            raise _rejected(
                f"the message has {len(message.text)} characters; the limit is {limit}. "
                "Put long material in a file in the workspace and refer to it."
            )
        # A message must leave room for the rest of the context and the reply, or no
        # checkpoint could ever make it fit. Counting is pure and deterministic.
        token_limit = self.window.hard_limit // 2
        tokens = count_tokens(message.text)
        if tokens > token_limit:
            raise _rejected(
                f"the message has {tokens} tokens; on this model a message may have at most "
                f"{token_limit}. Put long material in a file in the workspace and refer to it."
            )

    async def _background(self, kind: HarnessKind, model: type[BaseModel],
                          raw: RawValue | None) -> None:
        """One background input. A signal has no caller to tell, so whatever goes wrong is
        recorded as a notice (and `last_error`), and the session goes on."""
        label = _SIGNAL_LABELS[kind]
        if self.refused:
            workflow.logger.error("%s signal dropped: %s", label, self.refused)
            return
        if self.state.stopped_reason:
            workflow.logger.warning("input %s dropped: session stopped", kind)
            return
        try:
            if raw is None or raw is NO_PAYLOAD:
                raise ValueError("expected one argument")
            if not isinstance(raw, RawValue):
                raise ValueError("more than one argument")
            encoding = raw.payload.metadata.get("encoding", b"").decode(errors="replace")
            if encoding != "json/plain":
                raise ValueError(f"the payload's encoding is {encoding or 'missing'}, "
                                 "not json/plain")
            # Plain JSON, validated here: a lone surrogate escape decodes (and is replaced
            # below), a missing field is named.
            data: Any = model.model_validate(json.loads(raw.payload.data))
        except Exception as err:  # any undecodable payload is reported
            problem = _decode_problem(err)
            self.last_error = f"a malformed {kind.value} signal was dropped: {problem}"
            await self.record_notice(f"A {label} signal ({kind.value}) was malformed and its "
                                     f"input was lost: {problem}")
            return
        if kind is HarnessKind.WATCH:
            source_line = watch_source_line(data.watch_id, data.name)
        elif kind is HarnessKind.TASK:
            source_line = task_source_line(data.task_id, data.name)
        elif kind is HarnessKind.AGENT_RUN:
            source_line = agent_run_source_line(data.run_id, data.from_session)
        else:
            source_line = callback_source_line(data.run_id, data.from_session)
        source_line = make_storable(source_line)[0]
        lost = f"A {label} input ({source_line})"
        too_big = payload_problem(data.text)
        if too_big:
            self.last_error = f"{lost} was not recorded: {too_big}"
            await self.record_notice(f"{lost} was too large to record and was lost: "
                                     f"{too_big}")
            return
        text, replaced = make_storable(data.text)
        if replaced:
            text += f"\n[Keel: {'; '.join(replaced)}]"
        input_id = make_storable(data.input_id)[0] if data.input_id else None
        try:
            await self._record_input(kind.value, MessageType.HARNESS, text, source_line,
                                     input_id, patient=True, lost=lost)
        except ApplicationError as err:
            # Recorded already: the fence notice says what was lost; last_error says it too.
            workflow.logger.error("background input not recorded: %s", err)

    # Signals take their payload raw and validate it here, so a malformed one reaches the
    # session (which records what was wrong) instead of being dropped by the SDK's decoder.
    @workflow.signal(name=Handler.WATCH)
    async def watch(self, data: RawValue = NO_PAYLOAD) -> None:
        await self._background(HarnessKind.WATCH, WatchInput, data)

    @workflow.signal(name=Handler.TASK)
    async def task(self, data: RawValue = NO_PAYLOAD) -> None:
        await self._background(HarnessKind.TASK, TaskInput, data)

    @workflow.signal(name=Handler.AGENT_RUN)
    async def agent_run(self, data: RawValue = NO_PAYLOAD) -> None:
        await self._background(HarnessKind.AGENT_RUN, AgentRunInput, data)

    @workflow.signal(name=Handler.CALLBACK)
    async def callback(self, data: RawValue = NO_PAYLOAD) -> None:
        await self._background(HarnessKind.CALLBACK, CallbackInput, data)

    @workflow.update(name=Handler.AWAIT_REPLY)
    async def await_reply(self, data: AwaitReply) -> TurnOutcome:
        """Wait until the turn that answers input `seq` has ended."""
        return await self._outcome_of(data.seq)

    async def _outcome_of(self, seq: int) -> TurnOutcome:
        state = self.state
        await workflow.wait_condition(
            lambda: seq in self.outcomes or seq in self.lost or seq in self.redirects
            or state.stopped_reason is not None
            or self.continuing
            or (seq <= state.recorded_upto
                and all(p.seq != seq for p in state.pending)
                and self.phase == SessionPhase.IDLE)
        )
        if seq in self.lost:  # recorded by its turn's call, which could not: not kept
            raise ApplicationError(self.lost.pop(seq), type=Rejection.RECORD_FAILED,
                                   non_retryable=True)
        if seq in self.redirects:  # the same input, recorded before at another seq
            return await self._outcome_of(self.redirects.pop(seq))
        if seq not in self.outcomes and self.continuing:
            # Continue-as-new waits for every handler: this one must not hold it up.
            return TurnOutcome(turn=state.turn, input_seqs=[seq], retry=True)
        return self.outcomes.get(seq) or TurnOutcome(
            turn=state.turn, input_seqs=[seq], stopped_reason=state.stopped_reason,
            error=None if state.stopped_reason else "that input was answered earlier")

    @await_reply.validator
    def validate_await(self, data: AwaitReply) -> None:
        if data.seq < 1 or data.seq >= self.state.next_seq:
            raise ApplicationError(f"no input #{data.seq} in this session",
                                   type=Rejection.NO_SUCH_INPUT, non_retryable=True)

    # ----- queries ----------------------------------------------------------------------

    @workflow.query(name=Handler.STATUS)
    def status(self) -> SessionStatus:
        state = self.state
        return SessionStatus(
            session_id=state.session_id, phase=self.phase, turn=state.turn,
            context_tokens=state.context_tokens, context_window=state.config.context_window,
            checkpoint_threshold=self.window.threshold,
            checkpoint_count=state.checkpoint_count, pending_inputs=len(state.pending),
            window_start_seq=state.window_start_seq, last_seq=state.recorded_upto,
            model=state.config.model, stopped_reason=state.stopped_reason,
            last_error=self.last_error, pending_approvals=list(state.approvals),
            ended=state.ended,
            agent_instructions_chars=len(state.config.agent.instructions)
            if state.config.agent else 0,
            tools=[t.name for t in state.config.agent.tools] + [t.name for t in state.mcp_tools]
            if state.config.agent else [],
        )

    @workflow.query(name=Handler.MIND)
    def mind(self) -> str:
        return self.state.mind_text

    @workflow.query(name=Handler.MEMO)
    def memo(self) -> str:
        return self.state.memo_text

    @workflow.query(name=Handler.NOW)
    def now(self) -> str:
        return self.state.now_text

    # ----- the agent, approvals, ending, checkpoints on request (issue 8) ---------------

    @workflow.query(name=Handler.AGENT)
    def agent(self) -> AgentSpec | None:
        return self.state.config.agent

    @workflow.update(name=Handler.SET_AGENT)
    async def set_agent(self, spec: AgentSpec) -> SessionStatus:
        """A new agent for later turns; the record gets a notice so a reader sees when."""
        state = self.state
        before = state.config.agent
        state.config = state.config.with_agent(spec)
        self.window = state.config.window()
        if before is None or before.mcp_servers != spec.mcp_servers:
            state.mcp_listed = False
        await self.record_notice(
            f"The agent changed for later turns: model {state.config.model}, "
            f"{len(spec.tools)} service tools, {len(spec.mcp_servers)} MCP servers, "
            f"instructions of {len(spec.instructions)} characters.")
        return self.status()

    @set_agent.validator
    def validate_set_agent(self, spec: AgentSpec) -> None:
        self._refuse_if_ended()
        try:
            check_spec(spec, BUILTIN_NAMES)
        except AgentSpecError as err:
            raise ApplicationError(str(err), type=Rejection.AGENT_SPEC_REFUSED,
                                   non_retryable=True) from None

    @workflow.update(name=Handler.REFRESH_MCP)
    async def refresh_mcp(self) -> list[str]:
        await self.tools.ensure_mcp(refresh=True)
        return [t.name for t in self.state.mcp_tools]

    @workflow.query(name=Handler.PENDING_APPROVALS)
    def pending_approvals(self) -> list[PendingApproval]:
        return list(self.state.approvals)

    @workflow.update(name=Handler.DECIDE)
    async def decide_approval(self, decision: ApprovalDecision) -> DecisionRecorded:
        pending = self.tools.decide(decision)
        return DecisionRecorded(call_id=decision.call_id, approve=decision.approve,
                                tool=pending.tool)

    @decide_approval.validator
    def validate_decision(self, decision: ApprovalDecision) -> None:
        problem = decision_problem(self.state.approvals, self.state.decided_calls, decision)
        if problem:
            raise ApplicationError(problem, type=Rejection.NOT_PENDING, non_retryable=True)

    @workflow.update(name=Handler.END)
    async def end_session(self, data: EndSession) -> SessionStatus:
        """End the session: the running turn finishes (a pending approval is denied), the
        handlers finish, and the workflow completes with its final status."""
        state = self.state
        if not state.ended:
            state.ended = True
            state.stopped_reason = state.stopped_reason or f"the session was {data.reason}"
            await self.record_notice(f"The session was {data.reason}.")
        if self.phase in (SessionPhase.IDLE, SessionPhase.STOPPED):
            self.phase = SessionPhase.ENDED
        self.publish_summary()
        return self.status()

    @workflow.update(name=Handler.CHECKPOINT_NOW)
    async def checkpoint_now(self) -> SessionStatus:
        """A checkpoint on request, through the same chain and checks as an automatic one;
        it runs between turns, and this returns once it is done."""
        state = self.state
        state.checkpoint_requested = True
        # Continue-as-new waits for every handler: this one must not hold it up (the
        # request is in the carried state, and the new run takes the checkpoint).
        await workflow.wait_condition(
            lambda: not state.checkpoint_requested or state.stopped_reason is not None
            or self.continuing)
        return self.status()

    @checkpoint_now.validator
    def validate_checkpoint_now(self) -> None:
        self._refuse_if_ended()

    # ----- a client's file calls on the workspace (issue 12) -------------------------------
    # Updates, not queries: each runs one activity against the workspace store, on this
    # session's queue. The validators apply the file tools' path rules and the payload
    # bound before anything is written; the store applies its own limits.

    @workflow.update(name=Handler.PUT_FILE)
    async def put_file(self, data: PutFile) -> FileVersion:
        update = workflow.current_update_info()
        op_id = f"client-put-{update.id if update else workflow.uuid4()}"  # once per update
        done: FileVersion = await self._file_call(
            FileActivities.put_workspace_file,
            PutFileInput(session_id=self.state.session_id, path=data.path, data=data.data,
                         op_id=op_id))
        return done

    @put_file.validator
    def validate_put_file(self, data: PutFile) -> None:
        self._file_path_problem(data.path, for_write=True)
        if len(data.data) > FILE_CALL_MAX_BYTES:
            raise ApplicationError(limit_text(repr(data.path), len(data.data),
                                              FILE_CALL_MAX_BYTES),
                                   type=Rejection.FILE_REFUSED, non_retryable=True)

    @workflow.update(name=Handler.READ_FILE)
    async def read_file(self, data: ReadFile) -> FileData | None:
        found: FileData | None = await self._file_call(
            FileActivities.read_workspace_file,
            ReadFileInput(session_id=self.state.session_id, path=data.path))
        return found

    @read_file.validator
    def validate_read_file(self, data: ReadFile) -> None:
        self._file_path_problem(data.path, for_write=False)

    @workflow.update(name=Handler.LIST_FILES)
    async def list_files(self, data: ListFiles) -> list[FileEntry]:
        found: list[FileEntry] = await self._file_call(
            FileActivities.list_workspace_files,
            ListFilesInput(session_id=self.state.session_id, prefix=data.prefix))
        return found

    def _file_path_problem(self, path: str, *, for_write: bool) -> None:
        if self.refused:
            raise _rejected(self.refused)
        try:
            workspace_path(path, for_write=for_write)
        except ToolError as err:
            raise ApplicationError(str(err), type=Rejection.FILE_REFUSED,
                                   non_retryable=True) from None

    async def _file_call(self, method: Any, arg: BaseModel) -> Any:
        """One file activity; what it could not do fails the update with its reason."""
        try:
            return await workflow.execute_activity_method(method, arg, **FILE_CALL)
        except ActivityError as err:
            raise ApplicationError(_reason(err), type=Rejection.FILE_REFUSED,
                                   non_retryable=True) from None

    def _refuse_if_ended(self) -> None:
        if self.state.stopped_reason:
            raise ApplicationError(f"this session has stopped: {self.state.stopped_reason}",
                                   type=Rejection.SESSION_STOPPED, non_retryable=True)

    def publish_summary(self) -> None:
        """What `keel list` shows, in the workflow's memo (Temporal visibility)."""
        state = self.state
        window = max(state.config.context_window, 1)
        summary: dict[str, Any] = {
            "phase": self.phase.value, "turn": state.turn,
            "context_percent": round(100 * state.context_tokens / window, 1),
            "checkpoints": state.checkpoint_count,
            "last_activity": workflow.now().isoformat(timespec="seconds"),
        }
        workflow.upsert_memo({"keel": summary})

    async def checkpoint_while_waiting(self, before_seq: int) -> None:
        """A requested checkpoint in the middle of a turn that waits on an approval. It
        condenses only what came before the waiting call's assistant message (`before_seq`):
        the call, its wait line and its coming result stay in the window together, so the
        result is never cut off from its call."""
        state = self.state
        try:
            self.checkpoint_failures_this_turn = 0
            if before_seq - 1 >= state.window_start_seq:
                await self._checkpoint(before_seq - 1)
        finally:
            state.checkpoint_requested = False
            self.phase = SessionPhase.AWAITING_APPROVAL
            self.publish_summary()

    async def _requested_checkpoint(self) -> None:
        state = self.state
        try:
            if state.recorded_upto >= state.window_start_seq:
                self.turn_first_seq = state.next_seq
                self.checkpoint_failures_this_turn = 0
                await self._checkpoint(state.recorded_upto)
        finally:
            state.checkpoint_requested = False
            self.phase = SessionPhase.ENDED if state.ended else (
                SessionPhase.STOPPED if state.stopped_reason else SessionPhase.IDLE)
            self.publish_summary()

    # ----- the loop ---------------------------------------------------------------------

    def _ready(self) -> bool:
        state = self.state
        return state.stopped_reason is None and any(
            p.seq <= state.recorded_upto for p in state.pending)

    def should_continue_as_new(self) -> bool:  # the loop's and the approval wait's rule
        limit = self.state.config.continue_as_new_after_events
        info = workflow.info()
        return info.is_continue_as_new_suggested() or (
            limit > 0 and info.get_current_history_length() >= limit)

    @workflow.run
    async def run(self, input: SessionInput) -> SessionStatus:
        if self.refused:
            raise ApplicationError(self.refused, type="SessionIdMismatch", non_retryable=True)
        state = self.state
        if input.state is not None and (changed := scope_changed(
                input.state.config.memory_scope, input.config.memory_scope)):
            raise ApplicationError(changed, type=Rejection.MEMORY_SCOPE_FIXED,
                                   non_retryable=True)
        self.publish_summary()
        if state.turn_in_progress is not None:  # a turn carried over continue-as-new
            await self._run_turn()
        while state.stopped_reason is None:
            await workflow.wait_condition(
                lambda: self._ready() or self.should_continue_as_new()
                or state.stopped_reason is not None or state.checkpoint_requested)
            if state.checkpoint_requested and state.stopped_reason is None:
                await self._record_unrecorded()  # the checkpoint reads the record
                await self._requested_checkpoint()
            # Under a steady stream of inputs there is always a next turn: continue-as-new
            # comes first, carrying the queue, or the history would grow without bound.
            if self.should_continue_as_new() and state.stopped_reason is None:
                await self._continue_as_new()
            if self._ready():
                await self._run_turn()
        state.checkpoint_requested = False
        await self._record_unrecorded()  # a message asked as the session stopped is kept
        if state.ended:
            self.phase = SessionPhase.ENDED
        self.publish_summary()
        # The stream's last event, then its readers released, then the handlers awaited.
        self.events.emit(SessionEnded, turn=state.turn, reason=state.stopped_reason)
        self.events.detach()
        await workflow.wait_condition(
            lambda: workflow.all_handlers_finished() and not self.fencing
            and not self.transcribing)
        return self.status()

    async def continue_as_new_waiting(self, reply: ModelReply, next_call: int) -> NoReturn:
        """Continue as new in the middle of a turn whose call `next_call` of `reply` waits
        on a person; the new run resumes the turn there (`_run_turn`)."""
        assert self.progress is not None  # only a running turn's calls wait
        self.state.turn_in_progress = self.progress.model_copy(update={
            "reply": reply, "next_call": next_call, "memory_block": self.memory_block})
        await self._continue_as_new()

    async def _continue_as_new(self) -> NoReturn:
        """Hand the small state to a new run once every handler has finished."""
        state = self.state
        await self._record_unrecorded()  # never carried: the new run has no caller for it
        self.continuing = True
        # A reader's poll is an update handler: released first, or it would wait forever.
        self.events.detach()
        await workflow.wait_condition(
            lambda: workflow.all_handlers_finished() and not self.fencing
            and not self.transcribing)
        carried = state.turn_in_progress
        if carried is not None:  # a decision that came in meanwhile goes with the turn
            left = {c.id for c in carried.reply.tool_calls[carried.next_call:]}
            carried.decisions = [d for d in self.tools.decisions.values()
                                 if d.call_id in left]
        state.run_count += 1
        distinct = {id(o): o for o in self.outcomes.values()}.values()
        state.recent_outcomes = sorted(distinct, key=lambda o: o.turn)[-KEPT_OUTCOMES:]
        workflow.continue_as_new(SessionInput(
            session_id=state.session_id, config=state.config, state=state,
            events=self.events.carry()))

    async def _run_turn(self) -> None:
        state = self.state
        carried, state.turn_in_progress = state.turn_in_progress, None
        self.phase = SessionPhase.RUNNING
        self.checkpoint_failures_this_turn = 0
        if carried is None:
            state.turn += 1
            first = [p.seq for p in state.pending if p.seq <= state.recorded_upto]
            self.turn_first_seq = min(first) if first else state.next_seq
            self.events.emit(TurnStarted, turn=state.turn, input_seqs=first)
        self.observer.turn_started()
        # The turn's progress, kept where a continue-as-new during an approval wait finds it.
        self.progress = progress = carried or TurnInProgress(
            reply=ModelReply(seq=0, stop_reason=None), next_call=0,
            first_seq=self.turn_first_seq)
        answered, transcribe = progress.answered, progress.transcribe
        reply: ModelReply | None = None
        error: str | None = None
        self.turn_recall_failed, self.turn_recalled = None, []
        if carried is None:
            self.memory_block = ""  # searched by the turn's first model call
            await self.tools.ensure_mcp()
        else:  # carried over continue-as-new: the waiting call and the rest of its reply
            self.turn_first_seq, self.memory_block = carried.first_seq, carried.memory_block
            await self.tools.run_calls(carried.reply, carried.next_call)
        first = carried is None
        while True:
            reply, error, upto = await self._call_model(state.recorded_upto, first=first)
            first = False
            taking = [p.seq for p in state.pending if p.seq <= upto]
            state.pending = [p for p in state.pending if p.seq not in taking]
            answered.extend(taking)
            transcribe.extend(taking)
            if reply is None:
                break
            if reply.text.strip():
                transcribe.append(reply.seq)
            if reply.tool_calls and progress.rounds < state.config.max_tool_rounds_per_turn:
                progress.rounds += 1
                await self.tools.run_calls(reply)
                continue
            break
        outcome = TurnOutcome(
            turn=state.turn, input_seqs=answered,
            reply_seq=reply.seq if reply else None, reply_text=reply.text if reply else "",
            error=error, stopped_reason=state.stopped_reason)
        self.events.emit(TurnEnded, turn=state.turn, reply_seq=outcome.reply_seq,
                         reply_chars=len(outcome.reply_text),
                         reply_preview=outcome.reply_text, error=error,
                         model=self.observer.model, context_tokens=state.context_tokens,
                         context_window=state.config.context_window,
                         checkpoint_threshold=self.window.threshold)
        self.observer.turn_ended(error=error)
        for seq in answered:
            self.outcomes[seq] = outcome
        for old in sorted(self.outcomes)[:-MAX_OUTCOMES]:
            del self.outcomes[old]
        self.phase = SessionPhase.ENDED if state.ended else (
            SessionPhase.STOPPED if state.stopped_reason else SessionPhase.IDLE)
        self.publish_summary()
        # The caller has its reply; what is left is written after it.
        if self.turn_recall_failed:
            await self.record_notice(
                f"Long memory could not be searched this turn: {self.turn_recall_failed}")
        self._transcribe(transcribe, self.turn_recalled)

    def _recall_request(self) -> RecallInput | None:
        """This turn's search of long memory, with the newest input's words; None when the
        session has none or the input has no content words ("continue", "ok")."""
        state = self.state
        scope = state.config.memory_scope
        ready = [p for p in state.pending if p.seq <= state.recorded_upto]
        query = ready[-1].query if ready else ""
        if scope is None or not query.strip() or not wants_recall(query):
            return None
        return RecallInput(session_id=state.session_id, query=query, scope=scope)

    def _took_recall(self, result: ModelCallResult) -> None:
        """Adopt what the turn's first call found in long memory, or say why it could not
        search (the turn goes on without; a notice follows the reply)."""
        state = self.state
        if result.recall_failed:
            message = f"long memory could not be searched: {result.recall_failed}"
            self.last_error = message
            self.turn_recall_failed = result.recall_failed
            self.events.emit(ErrorEvent, turn=state.turn, message=message, where="memory")
        elif result.recall is not None:
            self.memory_block = result.recall.block
            self.turn_recalled = result.recall.sources
            if result.recall.hits:
                self.events.emit(RecallFound, turn=state.turn, hits=result.recall.hits,
                                 sources=result.recall.sources)

    def _transcribe(self, seqs: list[int], recalled: list[str]) -> None:
        """Queue this turn's inputs and replies for the vault's daily transcript (and its
        recall's hits for their access count): appended by one activity at a time, in the
        background, so the next turn does not wait for it."""
        if self.state.config.memory_scope is None or not (seqs or recalled):
            return
        self.transcript_seqs.extend(seqs)
        self.transcript_recalled.extend(recalled)
        if not self.transcribing:
            self.transcribing = True
            task = asyncio.create_task(self._append_transcripts())
            self.fence_tasks.add(task)  # held, as the fences are, until done
            task.add_done_callback(self.fence_tasks.discard)

    async def _append_transcripts(self) -> None:
        scope = self.state.config.memory_scope
        try:
            while self.transcript_seqs or self.transcript_recalled:
                seqs, self.transcript_seqs = self.transcript_seqs, []
                recalled, self.transcript_recalled = self.transcript_recalled, []
                if scope is None:
                    continue
                try:
                    await workflow.execute_activity_method(
                        MemoryActivities.append_transcripts,
                        TranscriptsInput(session_id=self.state.session_id, seqs=seqs,
                                         scope=scope, recalled=recalled),
                        **on_vault_queue(MEMORY_TURN))
                except ActivityError as err:
                    # The record keeps the messages; the nightly rollup reads the record too.
                    what = f"#{seqs[0]}-#{seqs[-1]}" if seqs else "recalled notes"
                    message = f"the transcript of {what} could not be written: {_reason(err)}"
                    self.last_error = message
                    self.events.emit(ErrorEvent, turn=self.state.turn, message=message,
                                     where="memory")
        finally:
            self.transcribing = False

    async def _call_model(self, upto: int, *, first: bool = False,
                          ) -> tuple[ModelReply | None, str | None, int]:
        """One model call, walking the room-making ladder first when the request does not
        fit. The turn's `first` call also records the messages folded into it and searches
        long memory. Returns the reply (None when the turn must end), the error said to the
        user, and the last seq the model saw."""
        state = self.state
        tried = RoomTried()
        records = [self.unrecorded[s] for s in sorted(self.unrecorded)]
        recall = self._recall_request() if first else None
        # A folded message's caller waits at most about the record timeout: half of it for
        # the call's record step, the rest for the ordinary record after it.
        record_within = state.config.record_timeout_s / 2
        called_at = workflow.now()
        while True:
            seq = state.allocate_seq()
            try:
                result: ModelCallResult = await workflow.execute_activity_method(
                    SessionActivities.call_model,
                    ModelCallInput(
                        session_id=state.session_id, turn=state.turn, reply_seq=seq,
                        window_start_seq=state.window_start_seq, upto_seq=upto,
                        checkpoint_id=state.checkpoint_id, model=state.config.model,
                        window=self.window, usage_ratio=state.usage_ratio,
                        room_asked=tried.asked, cut_newest_output=tried.output_cut,
                        memory_block=self.memory_block, keep_recent_seq=self.turn_first_seq,
                        memory_scope=state.config.memory_scope,
                        agent=state.config.agent, mcp_tools=state.mcp_tools,
                        record=records, record_within_s=record_within, recall=recall),
                    **MODEL_CALL)
            except ActivityError as err:
                if records:  # did the call record them? The ordinary record makes sure.
                    records = []
                    not_recorded = _failure_type(err) == INPUT_NOT_RECORDED
                    spent = (workflow.now() - called_at).total_seconds()
                    await self._record_unrecorded(  # a caller still waits: what is left
                        max(1, int(state.config.record_timeout_s - spent))
                        if not_recorded else None)
                    if not_recorded:  # the model was not asked
                        await self.fence(seq, "No reply here: the record did not take the "
                                              f"turn's message at first ({_reason(err)}).")
                        if not any(p.seq <= upto for p in state.pending):
                            return None, None, upto  # lost (its caller heard), or a retry
                        continue
                message = f"The model call failed: {_reason(err)}"
                self.last_error = message
                self.events.emit(ErrorEvent, turn=state.turn, message=message, where="model")
                await self.fence(seq, message)  # the notice, where a late reply would go
                return None, message, upto
            state.settle_seq(seq)
            for record, inserted in zip(records, result.recorded, strict=True):
                del self.unrecorded[record.seq]
                self._recorded(record, inserted)
            if records and not any(p.seq <= upto for p in state.pending):
                return None, None, upto  # a caller's retry of an input recorded before
            records = []
            if first and recall is not None:
                self._took_recall(result)
                recall = None  # searched once a turn; later calls send its block
            if result.stream_tail is not None and result.stream_tail.text:
                tail = result.stream_tail
                self.events.emit(TextDelta, turn=state.turn, reply_seq=seq,
                                 attempt=tail.attempt, index=tail.index, start=tail.start,
                                 text=tail.text)
            if result.reply is not None:
                self._account(result)
                self.observer.model_called(result.reply)
                if result.replaced:
                    await self.record_notice("The model's output held characters the record "
                                             "cannot store: " + "; ".join(result.replaced))
                return result.reply, None, upto
            state.context_tokens = result.estimated_tokens
            if not await self._make_room(result, tried, upto):
                await self._stop_too_long()
                return None, TOO_LONG_MESSAGE, upto
            upto = state.recorded_upto

    async def _make_room(self, result: ModelCallResult, tried: RoomTried, upto: int) -> bool:
        """Take the ladder's next rung for a request that was not sent. False: stop."""
        state = self.state
        step = next_step(result.fit, tried, checkpoint_allowed=checkpoint_allowed(
            self.checkpoint_failures_this_turn, state.recent_savings,
            state.config.context_window))
        if step is RoomStep.CHECKPOINT:
            tried.checkpoint = True
            await self._checkpoint(upto)
        elif step is RoomStep.MOVE_EARLIEST_HALF:
            before = state.context_tokens
            try:
                moved = await self.chain.move_half(upto, self.turn_first_seq)
            except ActivityError as err:
                moved = None
                self.last_error = f"moving the earliest half failed: {_reason(err)}"
            if moved is None:
                tried.move_failed = True
            else:
                self._adopt(moved)
                self._checkpoint_stored(CheckpointKind.MOVED, moved, before)
        elif step is RoomStep.CUT_NEWEST_OUTPUT:
            tried.output_cut = True
        elif step is RoomStep.STOP:
            return False
        else:  # SEND: past the threshold, nothing more to try, and it still fits
            tried.send_as_is = True
        return True

    async def _checkpoint(self, upto: int) -> None:
        """One model checkpoint; a failed or too small one counts against this turn."""
        self.phase = SessionPhase.CHECKPOINTING
        before = self.state.context_tokens
        self.events.emit(CheckpointStarted, turn=self.state.turn, tokens_before=before,
                         threshold=self.window.threshold)
        try:
            with self.observer.checkpoint_trace():
                stored = await self.chain.checkpoint(upto, self.turn_first_seq)
        except ActivityError as err:  # a step gave up: the session keeps its checkpoint
            stored = None
            self.chain.last_reason = _reason(err)
            self.last_error = f"checkpoint failed: {_reason(err)}"
            await self.record_notice(f"A checkpoint failed: {_reason(err)}")
        self.phase = SessionPhase.RUNNING
        if stored is not None:
            self._adopt(stored)
            kind = (CheckpointKind.FULL if self.chain.last_portion >= 1.0
                    else CheckpointKind.EARLIER_PART)
            self._checkpoint_stored(kind, stored, before)
        else:
            self.events.emit(CheckpointFailed, turn=self.state.turn,
                             reason=self.chain.last_reason)
            self.observer.checkpoint_failed(self.chain, before)
        if stored is None or not made_enough_room(stored.window_tokens_after, self.window):
            self.checkpoint_failures_this_turn += 1

    async def memory_flush_failed(self, checkpoint_no: int, err: ActivityError) -> None:
        """A memory flush gave up: the checkpoint goes on; status, the event stream and the
        record say what was not flushed."""
        message = f"Memory flush failed before checkpoint {checkpoint_no}: {_reason(err)}"
        self.last_error = message
        self.events.emit(ErrorEvent, turn=self.state.turn, message=message, where="memory")
        await self.record_notice(message)

    def _checkpoint_stored(self, kind: CheckpointKind, stored: StoreResult,
                           before: int) -> None:
        """The stored checkpoint's event and log line (the session has adopted it)."""
        self.events.emit(CheckpointStored, turn=self.state.turn, kind=kind,
                         checkpoint_id=stored.checkpoint_id, tokens_before=before,
                         tokens_after=stored.window_tokens_after, fallbacks=stored.fallbacks)
        self.observer.checkpoint_stored(kind, stored, before, self.chain)

    def _adopt(self, stored: StoreResult) -> None:
        """Point the session at the new checkpoint."""
        state = self.state
        state.checkpoint_id = stored.checkpoint_id
        state.window_start_seq = stored.cut_seq
        state.checkpoint_count += 1
        state.mind_text, state.memo_text = stored.mind_text, stored.memo_text
        state.now_text = stored.now_text
        state.context_tokens = stored.window_tokens_after
        state.recent_savings = remember_saving(state.recent_savings, stored.tokens_saved)

    def _account(self, result: ModelCallResult) -> None:
        state = self.state
        reply = result.reply
        assert reply is not None
        actual = reply.usage.context_tokens
        if actual and result.estimated_tokens:
            ratio = actual / result.estimated_tokens
            state.usage_ratio = min(2.0, max(0.5, ratio * state.usage_ratio))
        state.last_usage_tokens = actual
        state.context_tokens = (actual or result.estimated_tokens) + reply.reply_tokens

    async def record_notice(self, text: str) -> None:
        state = self.state
        seq = state.allocate_seq()
        try:
            await workflow.execute_activity_method(
                SessionActivities.record_input,
                RecordInput(session_id=state.session_id, seq=seq, input_id=f"notice-{seq}",
                            type=MessageType.NOTICE, text=make_storable(text)[0],
                            turn=state.turn, user_name=state.config.user_name),
                **RECORD_NOTICE)
        except ActivityError as err:
            self.last_error = f"{text} (and that notice could not be recorded: {_reason(err)})"
            workflow.logger.error("notice not recorded: %s", err)
        state.settle_seq(seq)

    async def _stop_too_long(self) -> None:
        self.state.stopped_reason = TOO_LONG_MESSAGE
        self.events.emit(SessionStopped, turn=self.state.turn, reason=TOO_LONG_MESSAGE)
        await self.record_notice(TOO_LONG_MESSAGE)
        self.phase = SessionPhase.STOPPED
