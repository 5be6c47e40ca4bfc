"""SessionWorkflow: one long-running agent session, as handlers and a loop.

The workflow is its handlers (updates, signals, queries and their validators), each a few
lines over the session's rooms, and the loop that runs turns between them: the inputs
(workflows.inbox: record, fold, fence, flush), the turns (workflows.turn: the model calls,
making room, checkpoints), the tool calls (workflows.tools), the agent's own initiative
(workflows.wakeups, workflows.delegation), and the small state they share (workflows.run).
Their module docstrings state what each keeps.

Invariants kept here:
- A session's identity is its workflow id: a run whose input names another session writes
  nothing and fails.
- A plain turn is one update (`Handler.ASK`; `send_message` + `await_reply` do the same in
  two steps). Every handler that waits lets continue-as-new go first: it answers `retry`
  (or its status) once the run is continuing, so no handler holds the run up.
- Continue-as-new happens between turns, or inside a turn whose tool call waits on a person
  (the turn's progress goes with the state, `TurnInProgress`, and the new run resumes it at
  the waiting call). Before it, and before the session's end, the messages still waiting
  for their turn's model call are recorded the ordinary way, subscribers are released, and
  every handler, fence and transcript has finished.
- A client's file calls are Updates that run one workspace activity each.
- Every entry point takes its payload raw and reads it itself (workflows.entry): a start
  that does not decode or validate fails at once with the reason, an Update's validator
  refuses an argument that does not decode (MALFORMED_INPUT), and every signal, of any name
  and with any number of payloads, comes through one handler, which records what was wrong
  in a notice. No input fails a workflow task.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

from pydantic import ValidationError
from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    # Only this block runs inside the sandbox: a module imported lazily there (here
    # `SessionConfig.window()` importing ModelWindow) is one class with the host's only
    # when it is passed through here, by name.
    import schemas.checkpoint.policy  # noqa: F401
    from activities.files import (
        FileActivities,
        ListFilesInput,
        PutFileInput,
        ReadFileInput,
    )
    from schemas.agent import (
        AgentSpec,
        AgentSpecError,
        ApprovalDecision,
        DecisionRecorded,
        PendingApproval,
        check_spec,
        decision_problem,
    )
    from schemas.attachments import attachment_problem
    from schemas.branch import RewindDone, RewindRequest
    from schemas.budget import BudgetAnswer
    from schemas.events import SessionEnded
    from schemas.files import FileData, FileEntry, FileVersion, ListFiles, PutFile, ReadFile
    from schemas.initiative import Wakeup
    from schemas.input_size import config_fit_problem, over_limits
    from schemas.interrupt import BusyAction
    from schemas.session import (
        MAX_INPUT_ID_CHARS,
        MAX_NOTE_CHARS,
        SESSION_WORKFLOW,
        AwaitReply,
        CancelWakeup,
        EndSession,
        Handler,
        MessageAccepted,
        ReadReply,
        Rejection,
        ReplyPart,
        SessionPhase,
        SessionState,
        SessionStatus,
        TurnOutcome,
        UserMessage,
        config_bounds_problem,
        text_limits,
    )
    from schemas.text import payload_problem, storable_problem
    from schemas.vault.scope import scope_changed
    from workflows.branch import Rewinder
    from workflows.carry import continue_as_new, query_text, read_reply, restore_texts
    from workflows.delegation import Delegation
    from workflows.entry import NO_PAYLOAD, arg, payload_json, start_input, valid_arg
    from workflows.events import SessionEvents
    from workflows.failures import decode_problem, rejected
    from workflows.files import file_call, file_path_problem, put_problem
    from workflows.inbox import BACKGROUND, Inbox
    from workflows.observe import TurnObserver
    from workflows.run import SessionRun
    from workflows.tools import BUILTIN_NAMES, ToolRunner
    from workflows.turn import TurnEnd, Turns
    from workflows.wakeups import Wakeups

__all__ = ["SessionWorkflow"]




@workflow.defn(name=SESSION_WORKFLOW)
class SessionWorkflow:
    @workflow.init
    def __init__(self, data: RawValue = NO_PAYLOAD) -> None:
        # Read here, not by the SDK's decoder: an input that does not decode fails the run
        # with its reason instead of every workflow task (workflows.entry).
        start = start_input(data, NO_PAYLOAD)
        self.input = input = start.value
        state = input.state or SessionState(session_id=input.session_id, config=input.config)
        self.state: SessionState = state
        outcomes: dict[int, TurnOutcome] = {}
        for outcome in state.recent_outcomes:
            for seq in outcome.input_seqs:
                outcomes[seq] = outcome
        workflow_id = workflow.info().workflow_id
        named = {input.session_id, state.session_id}
        self.refused: str | None = start.refused or (None if named == {workflow_id} else (
            f"this run names session {sorted(named - {workflow_id})[0]!r} but its workflow "
            f"id is {workflow_id!r}: a session's id is its workflow id; nothing was written"))
        self.refused_type = start.type if start.refused else "SessionIdMismatch"
        self.session = SessionRun(state, SessionEvents(input.session_id, input.events))
        self.inbox = Inbox(self.session)
        self.tools = ToolRunner(self.session, self.inbox.fence)
        self.tools.fold_row = self.inbox.fold_row
        self.turns = Turns(self.session, self.inbox, self.tools, TurnObserver(state), outcomes)
        # The agent's own initiative: its tools run here, its signals come to these.
        self.wakeups = Wakeups(self.session, self.inbox, self.tools.calling_seq)
        self.delegation = Delegation(self.session, self.inbox, outcomes, self.tools.calling_seq)
        self.rewinder = Rewinder(self.session, self.inbox, self.tools, self.turns.interrupts,
                                 self.wakeups, self.delegation)
        self.tools.initiative = {**self.wakeups.tools(), **self.delegation.tools()}
        self.turns.delegation = self.delegation
        self.own_signals: dict[str, Any] = {Handler.WAKEUP: self.wakeups.signalled,
                            Handler.PARENT_ENDED: self.delegation.parent_ended,
                            Handler.CHILD_ANSWER: self.delegation.told_by_child,
                            Handler.TRANSCRIPT_FAILED: self.turns.transcript.signalled}
        if state.ended:
            self.session.phase = SessionPhase.ENDED
        elif state.turn_in_progress is not None:  # a call of it waits on a person
            self.session.phase = SessionPhase.AWAITING_BUDGET if state.budget.request \
                else SessionPhase.AWAITING_APPROVAL

    # ----- inputs -----------------------------------------------------------------------

    # Every Update takes its argument raw: its validator reads it strictly and refuses what
    # does not decode (MALFORMED_INPUT), its handler reads what was accepted
    # (workflows.entry).
    @workflow.update(name=Handler.SEND_MESSAGE)
    async def send_message(self, data: RawValue = NO_PAYLOAD) -> MessageAccepted:
        message = arg(UserMessage, data, NO_PAYLOAD)
        files = await self.inbox.describe_files(message)
        await self._stop_if_asked(message)
        return await self.inbox.record_user(message, files)

    async def _stop_if_asked(self, message: UserMessage) -> None:
        """A message sent with policy `interrupt` stops the running turn (workflows.interrupt)."""
        if self.turns.interrupts.action(message) is BusyAction.INTERRUPT:
            await self.turns.interrupts.stop(by_message=True)

    @workflow.update(name=Handler.ASK)
    async def ask(self, data: RawValue = NO_PAYLOAD) -> TurnOutcome:
        """A plain turn in one update: record the message, then wait for the turn that
        answers it (the refusals and RECORD_FAILED of send_message, the outcome of
        await_reply; `retry` with the input's seq when the session continues as new).
        While the session is idle the turn's first model call records it (`fold_user`)."""
        message = arg(UserMessage, data, NO_PAYLOAD)
        # A message with files is not folded: they are read and described before it is
        # numbered, so a refusal reaches its sender with nothing recorded.
        if self.inbox.can_fold() and not message.attachments:
            return await self._outcome_of(self.inbox.fold_user(message))
        files = await self.inbox.describe_files(message)
        await self._stop_if_asked(message)
        accepted = await self.inbox.record_user(message, files)
        return await self._outcome_of(accepted.seq)

    @ask.validator
    def validate_ask(self, data: RawValue = NO_PAYLOAD) -> None:
        self.check_message(valid_arg(UserMessage, data, NO_PAYLOAD, "the message"))

    @send_message.validator
    def validate_message(self, data: RawValue = NO_PAYLOAD) -> None:
        self.check_message(valid_arg(UserMessage, data, NO_PAYLOAD, "the message"))

    def check_message(self, message: UserMessage) -> None:
        """Refuse, before anything is written, what the session could never record exactly.
        The size checks come first and cost at most one pass over the text."""
        state = self.state
        if self.refused:
            raise rejected(self.refused)
        if message.input_id is not None and len(message.input_id) > MAX_INPUT_ID_CHARS:
            raise rejected(f"the input id has {len(message.input_id)} characters; the "
                           f"limit is {MAX_INPUT_ID_CHARS}")
        if state.stopped_reason:
            raise ApplicationError(f"this session has stopped: {state.stopped_reason}",
                                   type=Rejection.SESSION_STOPPED, non_retryable=True)
        too_big = payload_problem(message.text)
        if too_big:
            raise rejected(too_big)
        for what, value in (("message", message.text), ("input id", message.input_id or "")):
            problem = storable_problem(value)
            if problem:
                raise rejected(f"the {what} cannot be recorded as written: {problem}. "
                                "Remove that character and send it again.")
        files_problem = attachment_problem(message.attachments)
        if files_problem:
            raise ApplicationError(files_problem, type=Rejection.ATTACHMENT_REFUSED,
                                   non_retryable=True)
        if not message.text.strip() and not message.attachments:
            raise rejected("the message is empty")
        if self.turns.interrupts.action(message) is BusyAction.REFUSE:
            refusal, kind = self.turns.interrupts.refusal()
            raise ApplicationError(refusal, type=kind, non_retryable=True)
        # A message must leave room for the rest of the context and the reply, or no
        # checkpoint could ever make it fit (schemas.input_size; pure and deterministic).
        too_much = over_limits(message.text, self.session.input_limits())
        if too_much:
            raise rejected(f"the message has {too_much}. Put long material in a file in the "
                           "workspace and refer to it.")

    # Every signal comes through this one handler, its payloads raw, however many there
    # are: a malformed one reaches the session (which records what was wrong) instead of
    # being dropped by the SDK's decoder, or failing the task when the count is wrong; a
    # name the session does not have is said in a notice too.
    @workflow.signal(dynamic=True)
    async def signal(self, name: str, args: Sequence[RawValue]) -> None:
        background = BACKGROUND.get(name)
        if self.refused:
            workflow.logger.error("%s signal dropped: %s", name[:100], self.refused)
        elif self.state.stopped_reason:
            workflow.logger.warning("input %s dropped: session stopped", name[:100])
        elif name in self.own_signals:
            await self.own_signals[name](args)
        elif background is None:
            await self.inbox.unknown_signal(name)
        elif name == Handler.AGENT_RUN and self.delegation.answered_already(args):
            workflow.logger.info("agent run from a child that has answered: said already")
        elif name != Handler.AGENT_RUN or not self.delegation.take(args):
            await self.inbox.background(*background, args)
            if name == Handler.AGENT_RUN:  # a child's answer: its delegate call goes on
                self.delegation.heard(args)

    @workflow.update(name=Handler.AWAIT_REPLY)
    async def await_reply(self, data: RawValue = NO_PAYLOAD) -> TurnOutcome:
        """Wait until the turn that answers input `seq` has ended."""
        return await self._outcome_of(arg(AwaitReply, data, NO_PAYLOAD).seq)

    async def _outcome_of(self, seq: int) -> TurnOutcome:
        state, inbox, run = self.state, self.inbox, self.session
        outcomes = self.turns.outcomes
        await workflow.wait_condition(
            lambda: seq in outcomes or seq in inbox.lost or seq in inbox.redirects
            or state.stopped_reason is not None
            or run.continuing
            or (seq <= state.recorded_upto
                and all(p.seq != seq for p in state.pending)
                and run.phase == SessionPhase.IDLE)
        )
        if seq in inbox.lost:  # recorded by its turn's call, which could not: not kept
            raise ApplicationError(inbox.lost.pop(seq), type=Rejection.RECORD_FAILED,
                                   non_retryable=True)
        if seq in inbox.redirects:  # the same input, recorded before at another seq
            return await self._outcome_of(inbox.redirects.pop(seq))
        if seq not in outcomes and run.continuing:
            # Continue-as-new waits for every handler: this one must not hold it up.
            return TurnOutcome(turn=state.turn, input_seqs=[seq], retry=True)
        return outcomes.get(seq) or TurnOutcome(
            turn=state.turn, input_seqs=[seq], stopped_reason=state.stopped_reason,
            error=None if state.stopped_reason else "that input was answered earlier")

    @await_reply.validator
    def validate_await(self, data: RawValue = NO_PAYLOAD) -> None:
        seq = valid_arg(AwaitReply, data, NO_PAYLOAD, "the wait").seq
        if seq < 1 or seq >= self.state.next_seq:
            raise ApplicationError(f"no input #{seq} in this session",
                                   type=Rejection.NO_SUCH_INPUT, non_retryable=True)

    @workflow.update(name=Handler.READ_REPLY)
    async def read_reply(self, raw: RawValue = NO_PAYLOAD) -> ReplyPart:
        """A reply's text past what its outcome carried (TurnOutcome.reply_cut)."""
        return await read_reply(self.state, arg(ReadReply, raw, NO_PAYLOAD))

    @read_reply.validator
    def validate_read_reply(self, raw: RawValue = NO_PAYLOAD) -> None:
        seq = valid_arg(ReadReply, raw, NO_PAYLOAD, "the reply read").seq
        if seq >= self.state.next_seq:
            raise ApplicationError(f"no message #{seq} in this session",
                                   type=Rejection.NO_SUCH_INPUT, non_retryable=True)

    # ----- queries ----------------------------------------------------------------------

    @workflow.query(name=Handler.STATUS)
    def status(self) -> SessionStatus:
        return self.session.status()

    @workflow.query(name=Handler.WAKEUPS)
    def list_wakeups(self) -> list[Wakeup]:
        return list(self.state.wakeups)

    @workflow.update(name=Handler.CANCEL_WAKEUP)
    async def cancel_wakeup(self, data: RawValue = NO_PAYLOAD) -> list[Wakeup]:
        wakeup_id = arg(CancelWakeup, data, NO_PAYLOAD).wakeup_id
        if await self.wakeups.cancel(wakeup_id) is not None:
            await self.session.record_notice(f"Wakeup {wakeup_id} was cancelled by a client.")
        return list(self.state.wakeups)

    @cancel_wakeup.validator
    def validate_cancel_wakeup(self, data: RawValue = NO_PAYLOAD) -> None:
        wakeup_id = valid_arg(CancelWakeup, data, NO_PAYLOAD, "the cancel request").wakeup_id
        if all(w.id != wakeup_id for w in self.state.wakeups):
            raise ApplicationError(f"no wakeup {wakeup_id[:100]!r} is scheduled",
                                   type=Rejection.NOT_PENDING, non_retryable=True)

    @workflow.query(name=Handler.MIND)
    def mind(self) -> str:
        return query_text(self.state, self.state.mind_text)

    @workflow.query(name=Handler.MEMO)
    def memo(self) -> str:
        return query_text(self.state, self.state.memo_text)

    @workflow.query(name=Handler.NOW)
    def now(self) -> str:
        return query_text(self.state, self.state.now_text)

    @workflow.query(name=Handler.STATE)
    def session_state(self) -> SessionState:
        return self.state

    @workflow.update(name=Handler.REWIND)
    async def rewind(self, raw: RawValue = NO_PAYLOAD) -> RewindDone:
        return await self.rewinder.rewind(arg(RewindRequest, raw, NO_PAYLOAD))

    @rewind.validator
    def validate_rewind(self, raw: RawValue = NO_PAYLOAD) -> None:
        self.rewinder.check(valid_arg(RewindRequest, raw, NO_PAYLOAD, "the rewind"))

    @workflow.query(name=Handler.AGENT)
    def agent(self) -> AgentSpec | None:
        return self.state.config.agent

    @workflow.update(name=Handler.SET_AGENT)
    async def set_agent(self, data: RawValue = NO_PAYLOAD) -> SessionStatus:
        """A new agent for later turns; the record gets a notice so a reader sees when."""
        spec, state = arg(AgentSpec, data, NO_PAYLOAD), self.state
        state.take_agent(spec)
        self.session.window = state.config.window()
        await self.session.record_notice(
            f"The agent changed for later turns: model {state.config.model}, "
            f"{len(spec.tools)} service tools, {len(spec.mcp_servers)} MCP servers, "
            f"instructions of {len(spec.instructions)} characters.")
        return self.status()

    @set_agent.validator
    def validate_set_agent(self, data: RawValue = NO_PAYLOAD) -> None:
        self._refuse_if_ended()
        try:
            spec = AgentSpec.model_validate_json(payload_json(data, NO_PAYLOAD))
            check_spec(spec, BUILTIN_NAMES)
            # The config the spec makes (its window, its reply room, its model's name), as
            # a start would check it: a spec that leaves its own requests no room is refused
            # here, not taken for every later turn to fail.
            after = self.state.config.with_agent(spec)
            if problem := config_fit_problem(after) or config_bounds_problem(after):
                raise AgentSpecError([problem])
        except (ValidationError, ValueError) as err:
            if isinstance(err, AgentSpecError):
                raise ApplicationError(str(err), type=Rejection.AGENT_SPEC_REFUSED,
                                       non_retryable=True) from None
            raise ApplicationError(
                f"the agent spec is refused: {decode_problem(err)}",
                type=Rejection.AGENT_SPEC_REFUSED, non_retryable=True) from None

    @workflow.update(name=Handler.REFRESH_MCP)
    async def refresh_mcp(self) -> list[str]:
        await self.tools.ensure_mcp(refresh=True)
        return [t.name for t in self.state.mcp_tools]

    @workflow.query(name=Handler.PENDING_APPROVALS)
    def pending_approvals(self) -> list[PendingApproval]:
        return list(self.state.approvals)

    @workflow.update(name=Handler.DECIDE)
    async def decide_approval(self, data: RawValue = NO_PAYLOAD) -> DecisionRecorded:
        decision = arg(ApprovalDecision, data, NO_PAYLOAD)
        pending = self.tools.decide(decision)
        return DecisionRecorded(call_id=decision.call_id, approve=decision.approve,
                                tool=pending.tool)

    @decide_approval.validator
    def validate_decision(self, data: RawValue = NO_PAYLOAD) -> None:
        decision = valid_arg(ApprovalDecision, data, NO_PAYLOAD, "the decision")
        problem = decision_problem(self.state.approvals, self.state.decided_calls, decision)
        if problem is None and (long := text_limits(
                note=(decision.note, MAX_NOTE_CHARS), by=(decision.by, MAX_INPUT_ID_CHARS))):
            raise rejected(f"the decision's {long}")
        if problem:
            raise ApplicationError(problem, type=Rejection.NOT_PENDING, non_retryable=True)

    @workflow.update(name=Handler.ANSWER_BUDGET)
    async def answer_budget(self, data: RawValue = NO_PAYLOAD) -> SessionStatus:
        """A person raises the reached budget, or refuses (workflows.budget)."""
        await self.turns.budget.answer(arg(BudgetAnswer, data, NO_PAYLOAD))
        return self.status()

    @answer_budget.validator
    def validate_budget(self, data: RawValue = NO_PAYLOAD) -> None:
        answer = valid_arg(BudgetAnswer, data, NO_PAYLOAD, "the budget answer")
        if problem := answer.problem():
            raise rejected(problem)
        if problem := self.turns.budget.answer_problem(answer):
            raise ApplicationError(problem, type=Rejection.NO_BUDGET_REQUEST,
                                   non_retryable=True)
        if answer.raise_by is not None and (problem := self.turns.budget.raise_problem(
                answer.raise_by)):
            raise rejected(f"the budget answer: {problem}")

    @workflow.update(name=Handler.INTERRUPT)
    async def interrupt(self) -> SessionStatus:
        """Stop the running turn's model call (a stop button); nothing when idle."""
        await self.turns.interrupts.stop()
        return self.status()

    @workflow.update(name=Handler.END)
    async def end_session(self, raw: RawValue = NO_PAYLOAD) -> SessionStatus:
        """End the session: the running turn finishes (a pending approval is denied), the
        handlers finish, and the workflow completes with its final status."""
        data, state = arg(EndSession, raw, NO_PAYLOAD), self.state
        if not state.ended:
            state.ended = True
            state.stopped_reason = state.stopped_reason or f"the session was {data.reason}"
            await self.session.record_notice(f"The session was {data.reason}.")
        if self.session.phase in (SessionPhase.IDLE, SessionPhase.STOPPED):
            self.session.phase = SessionPhase.ENDED
        self.session.publish_summary()
        return self.status()

    @end_session.validator
    def validate_end(self, raw: RawValue = NO_PAYLOAD) -> None:
        data = valid_arg(EndSession, raw, NO_PAYLOAD, "the end request")
        if long := text_limits(reason=(data.reason, MAX_NOTE_CHARS)):
            raise rejected(f"the end request's {long}")

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
            or self.session.continuing)
        return self.status()

    @checkpoint_now.validator
    def validate_checkpoint_now(self) -> None:
        self._refuse_if_ended()

    @workflow.update(name=Handler.PUT_FILE)
    async def put_file(self, raw: RawValue = NO_PAYLOAD) -> FileVersion:
        data, update = arg(PutFile, raw, NO_PAYLOAD), workflow.current_update_info()
        op_id = f"client-put-{update.id if update else workflow.uuid4()}"  # once per update
        done: FileVersion = await file_call(
            FileActivities.put_workspace_file,
            PutFileInput(session_id=self.state.session_id, path=data.path,
                         data=data.data or b"", staged=data.staged, op_id=op_id))
        return done

    @put_file.validator
    def validate_put_file(self, raw: RawValue = NO_PAYLOAD) -> None:
        put_problem(self.refused, valid_arg(PutFile, raw, NO_PAYLOAD, "the file"))

    @workflow.update(name=Handler.READ_FILE)
    async def read_file(self, raw: RawValue = NO_PAYLOAD) -> FileData | None:
        asked = arg(ReadFile, raw, NO_PAYLOAD)
        found: FileData | None = await file_call(
            FileActivities.read_workspace_file,
            ReadFileInput(session_id=self.state.session_id, path=asked.path,
                          at_most=asked.at_most))
        return found

    @read_file.validator
    def validate_read_file(self, raw: RawValue = NO_PAYLOAD) -> None:
        data = valid_arg(ReadFile, raw, NO_PAYLOAD, "the read request")
        file_path_problem(self.refused, data.path, for_write=False)

    @workflow.update(name=Handler.LIST_FILES)
    async def list_files(self, raw: RawValue = NO_PAYLOAD) -> list[FileEntry]:
        found: list[FileEntry] = await file_call(
            FileActivities.list_workspace_files,
            ListFilesInput(session_id=self.state.session_id,
                           prefix=arg(ListFiles, raw, NO_PAYLOAD).prefix))
        return found

    @list_files.validator
    def validate_list_files(self, raw: RawValue = NO_PAYLOAD) -> None:
        valid_arg(ListFiles, raw, NO_PAYLOAD, "the list request")
        if self.refused:
            raise rejected(self.refused)

    def _refuse_if_ended(self) -> None:
        if self.state.stopped_reason:
            raise ApplicationError(f"this session has stopped: {self.state.stopped_reason}",
                                   type=Rejection.SESSION_STOPPED, non_retryable=True)

    # ----- the loop ---------------------------------------------------------------------

    def _checkpoint_due(self) -> bool:
        return self.state.checkpoint_requested and not self.session.rewinding

    def _ready(self) -> bool:
        state = self.state
        return state.stopped_reason is None and not self.session.rewinding and any(
            p.seq <= state.recorded_upto for p in state.pending)

    @workflow.run
    async def run(self, data: RawValue = NO_PAYLOAD) -> SessionStatus:
        if self.refused:
            raise ApplicationError(self.refused, type=self.refused_type, non_retryable=True)
        state, run, input = self.state, self.session, self.input
        if input.state is not None and (changed := scope_changed(
                input.state.config.memory_scope, input.config.memory_scope)):
            raise ApplicationError(changed, type=Rejection.MEMORY_SCOPE_FIXED,
                                   non_retryable=True)
        run.publish_summary()
        await restore_texts(run)  # the checkpoint's texts, when continue-as-new left them
        self.wakeups.start()
        self.delegation.start()
        if state.turn_in_progress is not None:  # a turn carried over continue-as-new
            await self._run_turn()
        await self.delegation.begin()  # a child's task is its first input
        while state.stopped_reason is None:
            await workflow.wait_condition(  # a rewind holds a checkpoint too (run.rewinding)
                lambda: self._ready() or run.should_continue_as_new()
                or state.stopped_reason is not None or self._checkpoint_due())
            if self._checkpoint_due() and state.stopped_reason is None:
                await self.inbox.record_unrecorded()  # the checkpoint reads the record
                await self.turns.requested_checkpoint()
            # Under a steady stream of inputs there is always a next turn: continue-as-new
            # comes first, carrying the queue, or the history would grow without bound.
            if run.should_continue_as_new() and state.stopped_reason is None:
                await self._continue_as_new()
            if self._ready():
                await self._run_turn()
                await self.delegation.after_turn()  # a child answers its parent
        state.checkpoint_requested = False
        await self.inbox.record_unrecorded()  # a message asked as the session stopped is kept
        await self.wakeups.drop_all()
        await self.delegation.end_children()
        if state.ended:
            run.phase = SessionPhase.ENDED
        run.publish_summary()
        # The stream's last event, then its readers released, then the handlers awaited.
        run.events.emit(SessionEnded, turn=state.turn, reason=state.stopped_reason)
        run.events.detach()
        await workflow.wait_condition(self._all_finished)
        if self.delegation.answer is not None:  # a child whose parent hears its result
            return self.status().model_copy(update={"answer": self.delegation.answer})
        return self.status()

    async def _run_turn(self) -> None:
        """One turn; a turn whose call waits on a person may go over continue-as-new."""
        await restore_texts(self.session)  # when the run's first read of them failed
        if await self.turns.run_turn() is TurnEnd.CONTINUE_AS_NEW:
            await self._continue_as_new()

    def _all_finished(self) -> bool:
        """Every handler, fence and transcript done: the run may end."""
        return (workflow.all_handlers_finished() and not self.inbox.fencing
                and not self.turns.transcript.busy and not self.wakeups.firing
                and not self.delegation.busy)

    async def _continue_as_new(self) -> NoReturn:
        """Hand the small state to a new run once every handler has finished."""
        await continue_as_new(self.session, self.inbox, self.tools.decisions,
                              self.turns.outcomes.values(), self._all_finished)
        raise AssertionError("unreachable: continue_as_new does not return")
