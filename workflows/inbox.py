"""Inbox: a session's inputs, numbered, recorded, folded into a turn, or fenced.

Invariants:
- Inputs are numbered here, in the order their handlers ran, so every replay numbers them
  the same.
- Every input is either recorded byte for byte or refused with a reason: a user's message
  by the session's validator (unstorable text, over the payload limit), a background input
  by a notice (malformed, too large, an id or name over `MAX_INPUT_ID_CHARS`, a signal name
  the session does not have), and a background input's unstorable characters are replaced
  and named.
- A seq the session gives up on (an input not recorded in time, a failed model or tool
  call) is fenced with a notice saying what was lost (`activities.record.fence_seq`), so
  nothing can fill it late, and it settles only once fenced, so no window reads past it.
- A message asked while the session is idle (no turn running, nothing else waiting or being
  recorded) is numbered in the handler and written to the record by the turn's first model
  call, before it reads the window (`fold_user`, `unrecorded`). When that call could not
  record it, the ordinary record takes over (its retries, its deadline, RECORD_FAILED and
  the fence), so a message is in the record before anything reads past it, or its caller is
  told it was not kept (`lost`); anything else that would read the record first (a
  checkpoint asked for, continue-as-new, the session's end) records it the ordinary way
  before it reads (`record_unrecorded`). A caller's retry of an input recorded before
  waits for that one (`redirects`).
- Any other input is recorded by its own activity as it arrives (an ordinary one, so the
  server ends an attempt that hangs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.attachments import ResolveAttachments
    from activities.record import FenceInput, Inserted
    from activities.session import RecordInput, SessionActivities
    from schemas.attachments import Attachment, attachment_problem
    from schemas.events import InputRecorded
    from schemas.messages import (
        HarnessKind,
        MessageType,
        agent_run_source_line,
        callback_source_line,
        task_source_line,
        user_display_prefix,
        watch_source_line,
    )
    from schemas.session import (
        MAX_INPUT_ID_CHARS,
        AgentRunInput,
        CallbackInput,
        Handler,
        MessageAccepted,
        PendingInput,
        Rejection,
        SessionPhase,
        TaskInput,
        UserMessage,
        WatchInput,
    )
    from schemas.text import make_storable, payload_problem
    from workflows.failures import decode_problem, lost_notice, reason
    from workflows.options import RECORD_BACKGROUND, RECORD_FENCE, record_user_input
    from workflows.run import SessionRun

__all__ = ["BACKGROUND", "BACKGROUND_FILES_PATCH", "LONG_IDS_PATCH", "RECALL_QUERY_CHARS",
           "SIGNAL_LABELS", "UNKNOWN_SIGNAL_PATCH", "Inbox"]

RECALL_QUERY_CHARS = 500
# Behaviour new to sessions that may exist already, guarded (a replay takes the old path):
# a background input whose id or name is too long is a notice; so is an unknown signal.
LONG_IDS_PATCH = "background-ids-bounded"
UNKNOWN_SIGNAL_PATCH = "unknown-signal-notice"
# A background input's files (its `attachments`) are described and recorded with it.
BACKGROUND_FILES_PATCH = "background-input-files"

SIGNAL_LABELS = {HarnessKind.WATCH: "Watch", HarnessKind.TASK: "Task",
                  HarnessKind.AGENT_RUN: "agent run", HarnessKind.CALLBACK: "callback"}
# The background inputs by signal name: their kind and their payload's model.
BACKGROUND: dict[str, tuple[HarnessKind, type[BaseModel]]] = {
    Handler.WATCH: (HarnessKind.WATCH, WatchInput),
    Handler.TASK: (HarnessKind.TASK, TaskInput),
    Handler.AGENT_RUN: (HarnessKind.AGENT_RUN, AgentRunInput),
    Handler.CALLBACK: (HarnessKind.CALLBACK, CallbackInput),
}


class Inbox:
    """The input side of one session run. The durable part (the seqs, the pending queue)
    is `SessionState`; what is here lasts one run."""

    def __init__(self, run: SessionRun) -> None:
        self.run = run
        # Messages asked while idle, numbered but written by the turn's first model call
        # (`ask`); never carried over continue-as-new (written the ordinary way first).
        self.unrecorded: dict[int, RecordInput] = {}
        self.lost: dict[int, str] = {}  # seq -> why it was not recorded (its caller hears)
        self.redirects: dict[int, int] = {}  # seq -> the earlier seq of the same input id
        self.fencing: set[int] = set()  # seqs given up on whose tombstone is not written yet

    # ----- recording ---------------------------------------------------------------------

    async def record_input(
        self, kind: str, type_: MessageType, text: str, source_line: str | None,
        input_id: str | None, *, patient: bool, lost: str,
        attachments: Sequence[Attachment] = (),
    ) -> MessageAccepted:
        """Record one input at the next seq. When the record cannot take it in time, the
        seq is fenced with a notice saying `lost` and why, and RECORD_FAILED is raised.
        A background input over the input limits is recorded cut and kept whole in the
        workspace (schemas.input_size): it has nobody to refuse it to, and one input must
        not fill the window (a user's message over them was refused before it came here)."""
        state = self.run.state
        if self.fencing:
            await self._wait_fenced(patient)
        seq = state.allocate_seq()
        input_id = input_id or f"{kind}-{workflow.uuid4()}"
        record = RecordInput(session_id=state.session_id, seq=seq, input_id=input_id,
                             type=type_, text=text, source_line=source_line,
                             user_name=state.config.user_name, turn=state.turn + 1,
                             cut_over=self.run.input_limits()
                             if type_ is MessageType.HARNESS else None,
                             attachments=list(attachments))
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
                await self.fence(seq, lost_notice(lost, err))
            raise self.not_recorded(seq, lost, err, fence=not patient) from err
        state.settle_seq(seq)
        self._took(kind, text, source_line, seq, inserted, [a.name for a in attachments])
        return MessageAccepted(session_id=state.session_id, seq=inserted.seq,
                               input_id=input_id)

    async def _wait_fenced(self, patient: bool) -> None:
        """A retry of an input given up on must not meet its late twin: the fence first."""
        try:
            await workflow.wait_condition(
                lambda: not self.fencing,
                timeout=None if patient else self.run.state.config.record_timeout_s)
        except TimeoutError:
            raise ApplicationError(
                "the record is not answering (an earlier input is still not settled); "
                "nothing was kept, send it again", type=Rejection.RECORD_FAILED,
                non_retryable=True) from None

    def _took(self, kind: str, text: str, source_line: str | None, seq: int,
              inserted: Inserted, files: list[str] | None = None) -> None:
        """A recorded input joins the queue. A duplicate at this very seq is this
        activity's own retry (its first attempt wrote the row and its answer was lost): a
        new input. At another seq it is a caller's retry of an input recorded before."""
        state = self.run.state
        if not inserted.duplicate or inserted.seq == seq:
            self.run.events.emit(InputRecorded, turn=state.turn + 1, kind=kind,
                                 seq=inserted.seq, source_line=source_line,
                                 files=files or [])
            state.pending.append(PendingInput(seq=inserted.seq, kind=kind,
                                              query=text[:RECALL_QUERY_CHARS]))
            state.context_tokens += inserted.token_count

    def not_recorded(self, seq: int, lost: str, err: BaseException, *,
                     fence: bool = True) -> ApplicationError:
        """An input at `seq` given up on: said, fenced in the background unless `fence` is
        False (a caller hears now; the fence is written when the record answers), and the
        RECORD_FAILED its caller gets."""
        why = reason(err)
        self.run.last_error = f"{lost} could not be recorded: {why}"
        if fence:
            self.fencing.add(seq)
            self.run.hold(self.fence(seq, lost_notice(lost, err)))
        return ApplicationError(
            f"the message could not be recorded ({why}); nothing was kept, send it again",
            type=Rejection.RECORD_FAILED, non_retryable=True)

    async def fence(self, seq: int, notice: str) -> None:
        """Give up on `seq` for good: a tombstone notice over it, then settle it."""
        state = self.run.state
        self.fencing.add(seq)
        try:
            await workflow.execute_activity_method(
                SessionActivities.fence_seq,
                FenceInput(session_id=state.session_id, seq=seq,
                           text=make_storable(notice)[0], turn=state.turn,
                           user_name=state.config.user_name),
                **RECORD_FENCE)
        except ActivityError as err:
            self.run.last_error = f"seq {seq} could not be fenced: {reason(err)}"
            workflow.logger.error("seq %d not fenced: %s", seq, err)
        finally:
            self.fencing.discard(seq)
            state.settle_seq(seq)

    # ----- a user's message --------------------------------------------------------------

    def lost_user(self) -> str:
        return f"A message from {make_storable(self.run.state.config.user_name)[0]}"

    async def record_user(self, message: UserMessage,
                          files: Sequence[Attachment] = ()) -> MessageAccepted:
        """A user's message recorded, with its files as `describe_files` described them."""
        prefix = user_display_prefix(message.text, self.run.state.config.user_name)
        return await self.record_input(
            "user", MessageType.USER, message.text, prefix, message.input_id, patient=False,
            lost=self.lost_user(), attachments=files)

    async def describe_files(self, message: UserMessage) -> list[Attachment]:
        """The message's files read from the workspace and described, before it is
        numbered or stops a turn: a refusal is its sender's answer, and nothing is
        recorded, fenced or stopped."""
        state = self.run.state
        if not message.attachments:
            return []
        try:
            return await workflow.execute_activity_method(
                SessionActivities.resolve_attachments,
                ResolveAttachments(session_id=state.session_id, paths=message.attachments,
                                   text=message.text, limits=self.run.input_limits()),
                **record_user_input(state.config.record_timeout_s))
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == Rejection.ATTACHMENT_REFUSED:
                raise ApplicationError(cause.message, type=Rejection.ATTACHMENT_REFUSED,
                                       non_retryable=True) from None
            raise ApplicationError(
                f"the message's files could not be read ({reason(err)}); nothing was kept, "
                "send it again", type=Rejection.RECORD_FAILED, non_retryable=True) from err

    def can_fold(self) -> bool:
        """A message may be recorded by its turn's first model call: the session is idle,
        nothing waits, nothing is being recorded or fenced, and nothing but that turn will
        read the record first (no checkpoint asked for, no continue-as-new due)."""
        run, state = self.run, self.run.state
        return (run.phase == SessionPhase.IDLE and not state.pending and not self.unrecorded
                and not self.fencing and state.recorded_upto == state.next_seq - 1
                and not state.checkpoint_requested and state.turn_in_progress is None
                and not run.continuing and not run.should_continue_as_new())

    def fold_user(self, message: UserMessage) -> int:
        """Number a user's message and queue it for the next turn, which records it in its
        first model call. Said on the stream at once, as a recorded input is."""
        state = self.run.state
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
        self.run.events.emit(InputRecorded, turn=state.turn + 1, kind="user", seq=seq,
                             source_line=prefix)
        return seq

    def fold_background(self, kind: str, text: str, source_line: str, input_id: str) -> int:
        """A background input Keel makes itself (a child's task) folded into the next
        turn's first model call, as `fold_user` folds a message; only when `can_fold`."""
        state = self.run.state
        seq = state.allocate_seq()
        self.unrecorded[seq] = RecordInput(
            session_id=state.session_id, seq=seq, input_id=input_id, type=MessageType.HARNESS,
            text=text, source_line=source_line, user_name=state.config.user_name,
            turn=state.turn + 1, cut_over=self.run.input_limits())
        state.settle_seq(seq)
        state.pending.append(PendingInput(seq=seq, kind=kind, query=text[:RECALL_QUERY_CHARS]))
        self.run.events.emit(InputRecorded, turn=state.turn + 1, kind=kind, seq=seq,
                             source_line=source_line)
        return seq

    def fold_row(self, record: RecordInput) -> None:
        """A row Keel writes itself that asks for no turn (a delegate call's result, from
        workflows.tools) folded into the turn's next model call, at its own seq."""
        self.unrecorded[record.seq] = record
        self.run.state.settle_seq(record.seq)

    def folded(self) -> list[RecordInput]:
        """The messages waiting for their turn's model call, in seq order."""
        return [self.unrecorded[s] for s in sorted(self.unrecorded)]

    async def record_unrecorded(self, within_s: int | None = None) -> None:
        """Write the messages still waiting for their turn's model call the ordinary way
        (before anything else reads the record), each in at most `within_s` (the session's
        record timeout). One that cannot be is lost: its caller hears RECORD_FAILED, its
        seq is fenced."""
        for seq in sorted(self.unrecorded):
            record = self.unrecorded.pop(seq)
            try:
                inserted = await workflow.execute_activity_method(
                    SessionActivities.record_input, record, **record_user_input(
                        within_s or self.run.state.config.record_timeout_s))
            except ActivityError as err:
                self._drop_pending(seq)
                lost = ("A tool call's result" if record.type == MessageType.TOOL_RESULT
                        else self.lost_user())
                self.lost[seq] = str(self.not_recorded(seq, lost, err))
                continue
            self.recorded(record, inserted)

    def recorded(self, record: RecordInput, inserted: Inserted) -> None:
        """A message written by the turn's call or the ordinary record. A duplicate at
        another seq is a caller's retry of an input recorded before: its caller waits for
        that one, and this seq stays empty (nothing was or will be written there)."""
        if inserted.duplicate and inserted.seq != record.seq:
            self._drop_pending(record.seq)
            self.redirects[record.seq] = inserted.seq
        else:
            self.run.state.context_tokens += inserted.token_count

    def input_seqs(self) -> list[int]:
        """The seqs of inputs no turn has taken yet: waiting, folded, or being recorded
        (given out, not settled: between turns only inputs are)."""
        state = self.run.state
        unsettled = set(range(state.recorded_upto + 1, state.next_seq)) - set(
            state.recorded_seqs)
        return sorted({p.seq for p in state.pending} | set(self.unrecorded) | unsettled)

    def _drop_pending(self, seq: int) -> None:
        state = self.run.state
        state.pending = [p for p in state.pending if p.seq != seq]

    # ----- a background input ------------------------------------------------------------

    async def background(self, kind: HarnessKind, model: type[BaseModel],
                         args: Sequence[RawValue]) -> None:
        """One background input (a signal's raw payloads, validated here: exactly one). A
        signal has no caller to tell, so whatever goes wrong is recorded as a notice (and
        `last_error`), and the session goes on."""
        label = SIGNAL_LABELS[kind]
        try:
            data = _decode(model, args)
            long = _long_field(data)
            if long and workflow.patched(LONG_IDS_PATCH):  # recorded as given before
                raise ValueError(long)
        except Exception as err:  # any undecodable payload is reported
            problem = decode_problem(err)
            self.run.last_error = f"a malformed {kind.value} signal was dropped: {problem}"
            await self.run.record_notice(f"{_a(label)} signal ({kind.value}) was malformed and "
                                         f"its input was lost: {problem}")
            return
        source_line = make_storable(_source_line(kind, data))[0]
        lost = f"{_a(label)} input ({source_line})"
        too_big = payload_problem(data.text)
        if too_big:
            self.run.last_error = f"{lost} was not recorded: {too_big}"
            await self.run.record_notice(f"{lost} was too large to record and was lost: "
                                         f"{too_big}")
            return
        text, replaced = make_storable(data.text)
        if replaced:
            text += f"\n[Keel: {'; '.join(replaced)}]"
        files: list[Attachment] = []
        if data.attachments and workflow.patched(BACKGROUND_FILES_PATCH):
            files, unattached = await self.background_files(data.attachments, text)
            if unattached:  # nobody to refuse it to: the words are kept, and why not these
                text += f"\n[Keel: its files were not attached: {unattached}]"
        input_id = make_storable(data.input_id)[0] if data.input_id else None
        try:
            await self.record_input(kind.value, MessageType.HARNESS, text, source_line,
                                    input_id, patient=True, lost=lost, attachments=files)
        except ApplicationError as err:
            # Recorded already: the fence notice says what was lost; last_error says it too.
            workflow.logger.error("background input not recorded: %s", err)

    async def background_files(self, paths: list[str], text: str
                                ) -> tuple[list[Attachment], str]:
        """A background input's files described as a message's are, or why they were not
        (refused, as a message's would be; or the store not answering within the hour a
        background input is tried for). Too many, or a path no workspace holds, is refused
        here, before any activity (a signal may name thousands)."""
        if problem := attachment_problem(paths):
            return [], problem
        try:
            found: list[Attachment] = await workflow.execute_activity_method(
                SessionActivities.resolve_attachments,
                ResolveAttachments(session_id=self.run.state.session_id, paths=paths,
                                   text=text, limits=self.run.input_limits()),
                **RECORD_BACKGROUND)
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == Rejection.ATTACHMENT_REFUSED:
                return [], cause.message.removesuffix("; nothing was recorded")
            return [], f"they could not be read ({reason(err)})"
        return found, ""

    async def unknown_signal(self, name: str) -> None:
        """A signal the session has no handler for: said in a notice, then dropped (before,
        the SDK kept it in memory, waiting for a handler that never comes)."""
        if not workflow.patched(UNKNOWN_SIGNAL_PATCH):
            return
        shown = make_storable(name[:100])[0] + ("..." if len(name) > 100 else "")
        self.run.last_error = f"a signal named {shown!r} was dropped: no such signal"
        await self.run.record_notice(
            f"A signal named {shown!r} was sent to this session, which has no such signal "
            f"(it has: {', '.join(k.value for k in SIGNAL_LABELS)}); it was dropped.")


def _a(label: str) -> str:
    return f"{'An' if label[:1].lower() in 'aeiou' else 'A'} {label}"


def _long_field(data: BaseModel) -> str | None:
    """A background input's id or name over `MAX_INPUT_ID_CHARS` (only its text may be
    long: an id is an indexed column, a name goes into the source line)."""
    for name, value in data:
        if name != "text" and isinstance(value, str) and len(value) > MAX_INPUT_ID_CHARS:
            return f"{name}: {len(value)} characters, more than {MAX_INPUT_ID_CHARS}"
    return None


def _decode(model: type[BaseModel], args: Sequence[RawValue]) -> Any:
    """A signal's one payload as `model`: plain JSON, validated here, so a lone surrogate
    escape decodes (and is replaced later) and a missing field is named."""
    if len(args) != 1:
        raise ValueError("expected one argument" + (f", got {len(args)}" if args else ""))
    raw = args[0]
    encoding = raw.payload.metadata.get("encoding", b"").decode(errors="replace")
    if encoding != "json/plain":
        raise ValueError(f"the payload's encoding is {encoding or 'missing'}, "
                         "not json/plain")
    return model.model_validate(json.loads(raw.payload.data))


def _source_line(kind: HarnessKind, data: Any) -> str:
    if kind is HarnessKind.WATCH:
        return watch_source_line(data.watch_id, data.name)
    if kind is HarnessKind.TASK:
        return task_source_line(data.task_id, data.name)
    if kind is HarnessKind.AGENT_RUN:
        return agent_run_source_line(data.run_id, data.from_session)
    return callback_source_line(data.run_id, data.from_session)
