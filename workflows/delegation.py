"""Delegation: a session hands a task to a sub-agent, a child session of its own, and hears
its answer back as an agent-run input.

Invariants:
- A child is its own session (workflow, window, checkpoints) whose id is made from the
  parent's delegate call (`child_session_id`), so a retried or replayed call never starts
  two: the parent keeps it in `SessionState.children` before it starts it, and a start that
  finds it running (or closed) takes it as started. The refusal and the child's start
  input are made in one place (`schemas.delegation`).
- Who starts it: when a reply's only call is a waiting `delegate` that needs no approval
  and would not be refused, the reply's model call starts the child itself, through the
  client (activities.delegate_ahead), while this session's workflow task takes the reply;
  the call then takes that child as started (`ChildRun.ahead`), and a child started so
  that no call takes (refused after all, not run) is ended (`settle_ahead`). Otherwise the
  call starts it, as a Temporal child workflow.
- The child gets the task as its first input, an agent-run input whose source line Keel
  writes from the parent's call (`begin`); after the turn that answers it (or a failure),
  it answers its parent and ends itself (the child's side: workflows.delegated). A final
  reply of that turn is told to the parent by the model call that made it
  (`Handler.CHILD_ANSWER`), and the child then sends nothing more, when the parent hears
  that signal (`DelegatedTask.hears_call`: a parent on older code, mid rolling deploy,
  does not and is answered at the child's end); else
  a Temporal child whose parent waits answers in its run's result
  (`DelegatedTask.answer_in_result`; one that ends without an answer is a failure, heard
  from its completion), any other by a signal (`Handler.AGENT_RUN`). The parent takes one
  answer per child (a second is not recorded twice) and writes its source line. An answer
  from a child it does not know yet (the model call that started it is being retried),
  told or sent at the child's end, is kept for that child's call (`early`), which takes it
  at once (`EARLY_ANSWER_PATCH` for the latter).
- A child started ahead is no Temporal child: its parent asks now and then
  (`CHECK_FIRST_S`, doubling up to `CHECK_MAX_S`) whether it closed without answering
  (terminated, failed), as a child workflow's completion would tell it.
- The files a child wrote go home with its answer: copied to the parent's workspace before
  the answer is sent, by whichever sends it (the final model call, in its activity; the
  child's end, by `hand_back_home`, workflows.delegated), and named at the answer's end
  (the rules: schemas.handback). A parent's file changed meanwhile is never overwritten.
  The images among them ride with the answer by path: the parent records such an answer
  with them, as a message's files (described from its own workspace), never folded, and a
  call waiting on it goes on once it is recorded (`HANDBACK_SHOWN_PATCH`), so its model
  sees the chart it asked for.
- The parent waits or goes on, as the call asked: a waiting call pauses the turn
  (`AWAITING_CHILD`) until the answer comes; the answer and the call's result are then
  folded into the turn's next model call, which records them before it reads the window
  (`take`; workflows.tools `fold_result`), as an asked message's first call records it:
  from the answer's signal to the next model call is one workflow task.
  A child that outlives its timeout is ended, and its parent gets an agent-run input saying
  so; ending the parent ends its children (`Handler.PARENT_ENDED`), and a child so ended
  asks the model no more (its turn ends after the call in flight, workflows.turn).
- Replay: what the model call did for delegation is in its recorded result
  (`started_ahead`, `told_parent`), which a history from before lacks, so it replays as it
  ran, with no patch (as workflows.turn's transcript); dropping an agent-run input from a
  child that has answered is `AHEAD_PATCH`.
- Depth and fan-out are the spec's limits (`DelegationLimits`); a refusal is the call's
  error result. A session that never delegates makes no command here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.attachments import ShareFiles
    from activities.delegate_ahead import child_closed
    from activities.model_call import DelegationStep
    from activities.session import SessionActivities
    from schemas.attachments import Attachment
    from schemas.delegation import (
        DelegateAhead,
        TellParent,
        child_input,
        child_run,
        refusal,
    )
    from schemas.events import ChildAnswered, ChildStarted
    from schemas.initiative import ChildRun
    from schemas.messages import HarnessKind, MessageType, ToolCall, agent_run_source_line
    from schemas.session import (
        SESSION_WORKFLOW,
        AgentRunInput,
        EndSession,
        Handler,
        SessionPhase,
        SessionStatus,
        TurnOutcome,
    )
    from schemas.text import make_storable
    from workflows.delegated import HANDBACK_PATCH, HANDBACK_SHOWN_PATCH, ChildSide
    from workflows.inbox import Inbox
    from workflows.options import CHILD_CHECK, TOOL_CALL
    from workflows.run import SessionRun
    from workflows.wakeups import ToolFn

__all__ = ["AHEAD_PATCH", "DELEGATE_FILES_PATCH", "EARLY_ANSWER_PATCH", "HANDBACK_PATCH",
           "ROUND_TRIP_PATCH", "Delegation"]

# A shorter round trip (histories from before it replay as they were): the delegate call's
# result is written by the turn's next model call with the answer (workflows.tools), and
# the start of a waiting call is published once.
ROUND_TRIP_PATCH = "delegate-round-trip"
# Shorter still: a parent's model call starts the child of its reply's waiting `delegate`
# call itself, and a child's final model call tells its parent the answer
# (activities.delegate_ahead); histories from before replay as they were.
AHEAD_PATCH = "delegate-ahead"
# A child's answer at its end from a child this run does not know yet is kept for its call
# (`early`), not recorded as an input of its own while the call then waits for nothing.
EARLY_ANSWER_PATCH = "delegate-early-answer"
# A delegate call's `files` are copied to the child's workspace and carried by its task.
DELEGATE_FILES_PATCH = "delegate-files"
CHECK_FIRST_S, CHECK_MAX_S = 2.0, 60.0  # asking whether a child started ahead closed


class Delegation(ChildSide):
    """The parent's and the child's side of delegation in one session run."""

    def __init__(self, run: SessionRun, inbox: Inbox, outcomes: dict[int, TurnOutcome],
                 calling_seq: Callable[[], int | None] = lambda: None) -> None:
        self.run = run
        self.inbox = inbox
        self.calling_seq = calling_seq  # the assistant row of the call running now
        self.outcomes = outcomes  # the turns' outcomes, by input seq (workflows.turn)
        self.changes = 0
        self.busy = False  # a timeout is being recorded: continue-as-new waits for it
        # Children whose answer is being recorded with its images (heard already): the
        # call waiting on one goes on once its row is in the record.
        self.recording: set[str] = set()
        self.waiting: str | None = None  # the child a delegate call waits for now
        self.answer: AgentRunInput | None = None  # a child's, for its run's result
        self._task: asyncio.Task[None] | None = None
        # A reply's calls whose child its model call started (call id -> child), until the
        # call takes it (`_start`) or the calls are done without it (`settle_ahead`).
        self.ahead: dict[str, str] = {}
        # Answers told by children's model calls before this run knew the child (a parent's
        # model call retried after the child it started answered).
        self.early: dict[str, AgentRunInput] = {}
        self.told = False  # this child's task turn's final call told its parent
        self._checks: dict[str, tuple[int, datetime]] = {}  # child -> (checks, last)
        self._results: list[asyncio.Task[None]] = []  # children answering in their result

    def tools(self) -> dict[str, ToolFn]:
        return {"delegate": self.delegate}

    def start(self) -> None:
        self._task = asyncio.create_task(self.watch())

    # ----- the parent --------------------------------------------------------------------

    def _refusal(self, call: ToolCall) -> str | None:
        state = self.run.state
        active = sum(1 for c in state.children if c.done is None)
        return refusal(state.config, call, active, state.stopped_reason)

    async def delegate(self, call: ToolCall) -> tuple[str, bool]:
        state = self.run.state
        child = next((c for c in state.children if c.call_id == call.id), None)
        if child is None:  # a call replayed or resumed finds the child it started
            if problem := self._refusal(call):
                return f"delegate refused: {problem}", True
            try:
                child = await self._start(call)
            except ValueError as err:
                return f"delegate refused: {err}", True
        if not child.wait:
            return (f"Started sub-agent {child.agent} as session {child.session_id}; its "
                    "answer will arrive as an agent run input from it."), False
        self.run.phase = SessionPhase.AWAITING_CHILD
        self.run.publish_summary()
        self.waiting = child.session_id
        if (early := self.early.pop(child.session_id, None)) is not None \
                and child.done is None and not self._take(child, early):
            await self._record_answer(child, early)  # told before this run knew its child
        await workflow.wait_condition(lambda: child.done is not None or state.ended)
        if child.done == "timed out" and workflow.patched(ROUND_TRIP_PATCH):
            # The timeout's input first: the result below says it is above, and the next
            # model call (which writes the result) is to read it.
            await workflow.wait_condition(lambda: not self.busy)
        if child.session_id in self.recording:
            await workflow.wait_condition(lambda: child.session_id not in self.recording)
        self.waiting = None
        self.run.phase = SessionPhase.RUNNING
        if child.done is None:
            return (f"The session was ended while sub-agent {child.agent} worked; it was "
                    "ended too."), True
        if child.done == "answered":
            return (f"Sub-agent {child.agent} answered: its answer is the agent run input "
                    f"from #{child.session_id} above."), False
        return (f"Sub-agent {child.agent} {child.done}: see the agent run input from "
                f"#{child.session_id} above."), True

    async def _start(self, call: ToolCall) -> ChildRun:
        state = self.run.state
        child = child_run(state.session_id, state.config, call, workflow.now())
        child.ahead = ahead = self.ahead.pop(call.id, None) == child.session_id
        child.seq = self.calling_seq()
        by_result = False
        if not ahead:
            # A waiting call hears the answer from the child's completion (this run waits
            # for it: no continue-as-new comes between); one that goes on, by signal.
            by_result = child.wait and workflow.patched(ROUND_TRIP_PATCH)
            files = await self._share(call, child.session_id)  # ValueError: refused
            start = child_input(state.session_id, state.config, call, state.budget.spent,
                                answer_in_result=by_result, files=files)  # ValueError too
        state.children.append(child)
        self.changes += 1
        if not ahead:
            try:
                handle = await workflow.start_child_workflow(
                    SESSION_WORKFLOW, start, id=child.session_id,
                    task_queue=workflow.info().task_queue,
                    parent_close_policy=ParentClosePolicy.ABANDON, result_type=SessionStatus)
            except Exception as err:  # already started (a retry): it is the one
                workflow.logger.warning("child %s not started anew: %s", child.session_id, err)
            else:
                if by_result:
                    self._results.append(asyncio.create_task(self._result_of(child, handle)))
        self.run.events.emit(ChildStarted, turn=state.turn, child_session=child.session_id,
                             agent=child.agent, tool_use_id=call.id)
        if not child.wait or not workflow.patched(ROUND_TRIP_PATCH):
            self.run.publish_summary()  # a waiting call publishes its phase at once
        return child

    async def _share(self, call: ToolCall, child_session: str) -> list[Attachment]:
        """The call's files copied to the child's workspace, described; ValueError saying
        why when one is refused (nothing started)."""
        paths = call.input.get("files") or []
        if not paths or not workflow.patched(DELEGATE_FILES_PATCH):
            return []
        try:
            found: list[Attachment] = await workflow.execute_activity_method(
                SessionActivities.share_files, ShareFiles(
                    from_session=self.run.state.session_id, to_session=child_session,
                    call_id=call.id, paths=paths), **TOOL_CALL)
        except ActivityError as err:
            cause = err.cause
            raise ValueError(cause.message if isinstance(cause, ApplicationError)
                             else f"its files could not be copied ({err})") from None
        return found

    async def _result_of(self, child: ChildRun, handle: Any) -> None:
        """A child answering in its run's result: heard as its signal would be (`take`),
        and a child that ended without an answer (failed, terminated) as a failure."""
        lost = (f"Sub-agent {child.agent} (session {child.session_id}) ended without an "
                "answer")
        try:
            status: SessionStatus = await handle
            data = status.answer or AgentRunInput(
                run_id=child.call_id, from_session=child.session_id, text=lost + ".",
                outcome="failed", input_id=f"delegate-answer-{child.session_id}")
        except ChildWorkflowError as err:
            data = AgentRunInput(
                run_id=child.call_id, from_session=child.session_id,
                text=f"{lost}: {err.cause or err}", outcome="failed",
                input_id=f"delegate-answer-{child.session_id}")
        if child.done is not None or self.run.state.stopped_reason:
            return  # timed out, ended, or its model call told this session: said already
        if not self._take(child, data):
            await self._record_answer(child, data)

    async def _record_answer(self, child: ChildRun, data: AgentRunInput) -> None:
        """An answer no call folds: recorded the ordinary way. One with the images the
        child's files brought home is recorded with them (`HANDBACK_SHOWN_PATCH`),
        described from this session's workspace, where they are now, as a background
        input's files are; a call waiting on it goes on once its row is in the record
        (`recording`)."""
        shown = bool(data.attachments) and workflow.patched(HANDBACK_SHOWN_PATCH)
        self._answered(child, data)  # heard at once: no other path takes it again
        if shown:
            self.recording.add(child.session_id)
        self.busy = True
        try:
            text, files = make_storable(data.text)[0], list[Attachment]()
            if shown:
                files, unattached = await self.inbox.background_files(data.attachments, text)
                if unattached:  # the words are kept, and why not these
                    text += f"\n[Keel: its images were not attached: {unattached}]"
            await self.inbox.record_input(
                HarnessKind.AGENT_RUN.value, MessageType.HARNESS, text,
                agent_run_source_line(data.run_id, data.from_session),
                make_storable(data.input_id or f"agent-run-{child.session_id}")[0],
                patient=True, lost=f"The answer of sub-agent {child.agent}", attachments=files)
        except ApplicationError as err:
            workflow.logger.error("child answer not recorded: %s", err)
        finally:
            self.busy = False
            self.recording.discard(child.session_id)

    def _child_of(self, args: Sequence[RawValue]) -> tuple[ChildRun, AgentRunInput] | None:
        """The working child an agent-run signal comes from, and what it says."""
        state = self.run.state
        if not state.children or (data := _answer_in(args)) is None:
            return None  # a malformed one: the inbox records it so
        child = next((c for c in state.children if c.session_id == data.from_session
                      and c.done is None), None)
        return None if child is None else (child, data)

    def take(self, args: Sequence[RawValue]) -> bool:
        """A child's answer while its delegate call waits: folded into the turn's next model
        call (which records it, as an asked message's first call does), so the wait ends
        without a record activity of its own. The answer of a child this run does not know
        yet is kept for its call (`early`). False: record it the ordinary way."""
        found = self._child_of(args)
        if found is None:
            return self._early_run(args)
        return self._take(*found)

    def _early_run(self, args: Sequence[RawValue]) -> bool:
        """A child's answer at its end (it could not tell this session from its model call)
        heard before the model call that started it is known here (that call retried after
        the child ended): kept for its delegate call, as `told_by_child` keeps an early
        one, so the call takes it at once instead of waiting out the child's timeout."""
        spec = self.run.state.config.agent
        if self.run.phase is not SessionPhase.RUNNING or spec is None or not spec.sub_agents:
            return False  # no call is out that could have started a child
        data = _answer_in(args)
        if data is None or data.input_id != f"delegate-answer-{data.from_session}" \
                or not self._may_be_early(data):
            return False
        if not workflow.patched(EARLY_ANSWER_PATCH):
            return False
        self.early[data.from_session] = data
        return True

    def _take(self, child: ChildRun, data: AgentRunInput) -> bool:
        if child.session_id != self.waiting:
            return False
        if data.attachments and workflow.patched(HANDBACK_SHOWN_PATCH):
            return False  # its images ride with it: recorded with them, not folded
        self.inbox.fold_background(
            HarnessKind.AGENT_RUN.value, make_storable(data.text)[0],
            agent_run_source_line(data.run_id, data.from_session),
            make_storable(data.input_id or f"agent-run-{child.session_id}")[0])
        self._answered(child, data)
        return True

    # ----- the model call's part (activities.delegate_ahead) -------------------------------

    def step(self, answered: dict[int, TurnOutcome]) -> DelegationStep | None:
        """What the next model call does for delegation: a parent's may start its reply's
        child itself, a child's task turn's call tells its parent a final answer."""
        state = self.run.state
        spec, task = state.config.agent, state.config.delegated
        ahead = tell = None
        if spec is not None and spec.sub_agents and state.stopped_reason is None:
            ahead = DelegateAhead(  # its agent is the call's (ModelAsk)
                parent_session=state.session_id, config=state.config.with_agent(None),
                spent=state.budget.spent,
                active=sum(1 for c in state.children if c.done is None))
        if task is not None and task.hears_call and state.delegated_seq \
                and state.delegated_seq not in answered and not state.ended and not self.told:
            tell = TellParent(parent_session=task.parent_session, call_id=task.call_id,
                              spent=state.budget.spent, files=task.files,
                              bring_back=task.bring_back)
        return None if ahead is None and tell is None else DelegationStep(ahead=ahead,
                                                                           tell=tell)

    def took(self, started_ahead: dict[str, str], told_parent: bool) -> None:
        """A model call's result: the children it started, whether it told the parent."""
        self.ahead.update(started_ahead)
        self.told = self.told or told_parent

    async def settle_ahead(self) -> None:
        """The reply's calls are done: a child started ahead that no call took (refused,
        not run) is ended."""
        for call_id, child_id in sorted(self.ahead.items()):
            del self.ahead[call_id]
            try:
                await workflow.get_external_workflow_handle(child_id).signal(
                    Handler.PARENT_ENDED, EndSession(reason="ended: its delegate call "
                                                            "did not run"))
            except Exception as err:  # it ended already
                workflow.logger.info("child %s not signalled: %s", child_id, err)

    async def told_by_child(self, args: Sequence[RawValue]) -> None:
        """`Handler.CHILD_ANSWER`: a child's final model call tells its answer (before the
        child's own answer at its end, which then says nothing more)."""
        found = self._child_of(args)
        if found is None:
            self._keep_early(args)
            return
        if not self._take(*found):
            await self._record_answer(*found)

    def _keep_early(self, args: Sequence[RawValue]) -> None:
        if (data := _answer_in(args)) is not None and self._may_be_early(data):
            self.early[data.from_session] = data

    def _may_be_early(self, data: AgentRunInput) -> bool:
        """From a child of this session (by its id) this run does not know (yet)."""
        state = self.run.state
        return data.from_session.startswith(f"{state.session_id}.") \
            and len(self.early) < 16 \
            and all(c.session_id != data.from_session for c in state.children)

    def answered_already(self, args: Sequence[RawValue]) -> bool:
        """An agent-run input from a child that has answered (its model call told this
        session first): said already, not recorded again."""
        if (data := _answer_in(args)) is None:
            return False
        return data.input_id == f"delegate-answer-{data.from_session}" and any(
            c.session_id == data.from_session and c.done in ("answered", "failed")
            for c in self.run.state.children) and workflow.patched(AHEAD_PATCH)

    def heard(self, args: Sequence[RawValue]) -> None:
        """An agent-run input was recorded: if a child of this session sent it, the child
        has answered (or failed)."""
        if (found := self._child_of(args)) is not None:
            self._answered(*found)

    def _answered(self, child: ChildRun, data: AgentRunInput) -> None:
        state = self.run.state
        child.done = "failed" if data.outcome == "failed" else "answered"
        if data.spent is not None:  # the child's spend counts against this session's budget
            state.budget.add_child(data.spent)
        self.changes += 1
        self.run.events.emit(ChildAnswered, turn=state.turn, child_session=child.session_id,
                             outcome=child.done, preview=data.text)

    async def watch(self) -> None:
        """End a child that outlives its timeout, and tell the parent's record; ask now and
        then whether a child started ahead closed without answering."""
        state, run = self.run.state, self.run
        while state.stopped_reason is None and not run.continuing:
            seen = self.changes
            active = [c for c in state.children if c.done is None]
            due = min(active, key=lambda c: c.deadline) if active else None
            checks = [(self._next_check(c), c) for c in active if c.ahead]
            check = min(checks, key=lambda t: t[0]) if checks else None
            at = min([t for t in (due and due.deadline, check and check[0]) if t],
                     default=None)
            left = None if at is None else (at - workflow.now()).total_seconds()
            if left is None or left > 0:
                try:
                    await workflow.wait_condition(
                        lambda seen=seen: self.changes != seen  # type: ignore[misc]
                        or state.stopped_reason is not None or run.continuing,
                        timeout=None if left is None else timedelta(seconds=left))
                except TimeoutError:
                    pass
                continue
            if due is not None and due.deadline <= workflow.now():
                await self._timed_out(due)
            elif check is not None:
                await self._check(check[1])

    def _next_check(self, child: ChildRun) -> datetime:
        """When to ask next whether `child` closed: 2 s after its start, then twice as long
        each time, at most a minute apart."""
        done, at = self._checks.get(child.session_id, (0, child.started))
        return at + timedelta(seconds=min(CHECK_FIRST_S * 2 ** done, CHECK_MAX_S))

    async def _check(self, child: ChildRun) -> None:
        done, _ = self._checks.get(child.session_id, (0, child.started))
        self._checks[child.session_id] = (done + 1, workflow.now())
        try:
            closed: str | None = await workflow.execute_activity(
                child_closed, child.session_id, **CHILD_CHECK)
        except ActivityError as err:
            workflow.logger.info("child %s not checked: %s", child.session_id, err)
            return
        if closed is None or child.done is not None or self.run.state.stopped_reason:
            return
        data = AgentRunInput(
            run_id=child.call_id, from_session=child.session_id, outcome="failed",
            text=(f"Sub-agent {child.agent} (session {child.session_id}) ended without an "
                  f"answer: it was {closed}."),
            input_id=f"delegate-answer-{child.session_id}")
        if not self._take(child, data):
            await self._record_answer(child, data)

    async def _timed_out(self, child: ChildRun) -> None:
        seconds = (child.deadline - child.started).total_seconds()
        child.done = "timed out"
        self.changes += 1
        self.busy = True
        try:
            await self._tell_timeout(child, seconds)
        finally:
            self.busy = False

    async def _tell_timeout(self, child: ChildRun, seconds: float) -> None:
        await self._end_child(child, f"ended: it did not answer within {seconds:g} s")
        text = (f"Sub-agent {child.agent} (session {child.session_id}) did not answer within "
                f"{seconds:g} s; it was ended.")
        try:
            await self.inbox.record_input(
                HarnessKind.AGENT_RUN.value, MessageType.HARNESS, text,
                agent_run_source_line(child.call_id, child.session_id),
                f"delegate-timeout-{child.session_id}", patient=True,
                lost=f"The timeout of sub-agent {child.agent}")
        except ApplicationError as err:
            workflow.logger.error("child timeout not recorded: %s", err)
        self.run.events.emit(ChildAnswered, turn=self.run.state.turn,
                             child_session=child.session_id, outcome="timed out")

    async def _end_child(self, child: ChildRun, reason: str) -> None:
        try:
            await workflow.get_external_workflow_handle(child.session_id).signal(
                Handler.PARENT_ENDED, EndSession(reason=reason))
        except Exception as err:  # it ended already
            workflow.logger.info("child %s not signalled: %s", child.session_id, err)

    async def end_children(self) -> None:
        """The parent ends: every child still working ends too."""
        for child in self.run.state.children:
            if child.done is None:
                child.done = "ended"
                await self._end_child(child, "ended: its parent session ended")

    async def end_after(self, seq: int) -> list[ChildRun]:
        """A rewind to `seq`: the children still working that a call after it started are
        ended (their answers would come into a context that never asked), and a notice
        names them."""
        gone = [c for c in self.run.state.children
                if c.done is None and c.seq is not None and c.seq > seq]
        for child in gone:
            child.done = "ended"
            await self._end_child(child, f"ended: the session that delegated to it was "
                                         f"rewound to #{seq}, before its delegate call")
        if gone:
            self.run.publish_summary()
            await self.run.record_notice(
                f"The rewind to #{seq} ended the sub-agents its abandoned rows started: "
                + "; ".join(f"{c.agent} (session {c.session_id})" for c in gone))
        return gone


def _answer_in(args: Sequence[RawValue]) -> AgentRunInput | None:
    """The agent-run input a signal carries, or None when it carries none (malformed)."""
    if len(args) != 1:
        return None
    try:
        return AgentRunInput.model_validate(json.loads(args[0].payload.data))
    except Exception:
        return None
