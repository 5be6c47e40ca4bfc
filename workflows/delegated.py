"""Delegation, the child's side: a sub-agent session takes its task as its first input and,
once the turn that answers it is over, answers its parent and ends.

Invariants:
- The task is recorded once (`begin`), in the parent's voice: an agent-run input whose
  source line Keel writes from the parent's call; with files, by the record (their bytes in
  the row), else folded into the first model call as an asked message's words are.
- The answer (`after_turn`) is the task turn's final reply, or a failure saying why; the
  files the child wrote go home first (activities.handback; `HANDBACK_PATCH`) unless its
  final model call told the parent and copied them itself; the images among them ride
  with the answer, by path (`AgentRunInput.attachments`, `HANDBACK_SHOWN_PATCH`). It goes
  in the run's result when the parent waits on the child workflow (`answer_in_result`),
  not at all when the model call told it, else by the agent-run signal; then the child
  ends.
- A parent that ends (or gives up on the child) ends it (`parent_ended`), with a notice.

Mixed into `workflows.delegation.Delegation`, whose state it reads (the run, the inbox,
the turns' outcomes, whether a model call told the parent).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.handback import HandBack, HandedHome
    from activities.session import SessionActivities
    from schemas.delegation import ANSWER_CHARS
    from schemas.handback import with_line
    from schemas.messages import HarnessKind, MessageType, agent_run_source_line
    from schemas.session import (
        AgentRunInput,
        EndSession,
        Handler,
        SessionPhase,
        TurnOutcome,
    )
    from schemas.text import make_storable
    from workflows.inbox import Inbox
    from workflows.options import TOOL_CALL
    from workflows.run import SessionRun

__all__ = ["HANDBACK_PATCH", "HANDBACK_SHOWN_PATCH", "ChildSide"]

# A child answering at its end copies the files it wrote to its parent's workspace first
# (its final model call, telling the parent, does so in its activity: no command).
HANDBACK_PATCH = "delegate-hand-back"
# The answer names the images that came home, for its parent to show its model with it
# (the child: `hand_back_home` instead of `hand_back_files`; the parent records such an
# answer with them instead of folding it).
HANDBACK_SHOWN_PATCH = "delegate-hand-back-shown"


class ChildSide:
    """What a delegated session does with its task: take it, answer it, end."""

    run: SessionRun
    inbox: Inbox
    outcomes: dict[int, TurnOutcome]
    told: bool  # its task turn's final model call told its parent
    answer: AgentRunInput | None  # for its run's result

    async def begin(self) -> None:
        """A child's first input: its task, recorded once, in the parent's voice."""
        state = self.run.state
        task = state.config.delegated
        if task is None or state.delegated_seq is not None or state.stopped_reason:
            return
        state.delegated_seq = 0  # taken: a retry of this run's start records nothing more
        text = make_storable(task.task)[0]
        source_line = agent_run_source_line(task.call_id, task.parent_session)
        # Written by the first model call, as an asked message; with files, by the record
        # (it puts their bytes in the row, as a message's).
        if self.inbox.can_fold() and not task.files:
            state.delegated_seq = self.inbox.fold_background(
                HarnessKind.AGENT_RUN.value, text, source_line, f"delegated-{task.call_id}")
            return
        try:
            accepted = await self.inbox.record_input(
                HarnessKind.AGENT_RUN.value, MessageType.HARNESS, text, source_line,
                f"delegated-{task.call_id}", patient=True, lost="The delegated task",
                attachments=task.files)
        except ApplicationError as err:
            await self._answer("failed", f"the task could not be recorded: {err.message}")
            return
        state.delegated_seq = accepted.seq

    async def after_turn(self) -> None:
        """A child whose task's turn has ended answers its parent and ends."""
        state = self.run.state
        task, seq = state.config.delegated, state.delegated_seq
        if task is None or not seq or state.ended:
            return
        outcome = self.outcomes.get(seq)
        if outcome is None and state.stopped_reason is None:
            return
        if outcome is not None and outcome.error is None and outcome.reply_text.strip():
            text, result = outcome.reply_text, "answered"
        else:
            why = (outcome.error if outcome else None) or state.stopped_reason or "no reply"
            text, result = f"Sub-agent {task.agent} failed: {why}", "failed"
        shown: list[str] = []
        if not (self.told and result == "answered"):  # its final model call sent them
            text, shown = await self._with_files(text)
        await self._answer(result, text, shown)

    async def _with_files(self, text: str) -> tuple[str, list[str]]:
        """`text` ending with the line that names the files this child wrote, copied to its
        parent's workspace first (activities.handback), and the images of them to show
        with it (`HANDBACK_SHOWN_PATCH`: before, none)."""
        state = self.run.state
        task = state.config.delegated
        assert task is not None
        if not workflow.patched(HANDBACK_PATCH):
            return text, []
        back = HandBack(child_session=state.session_id, parent_session=task.parent_session,
                        call_id=task.call_id, shared=task.files, only=task.bring_back)
        home = HandedHome()
        try:
            if workflow.patched(HANDBACK_SHOWN_PATCH):
                home = await workflow.execute_activity_method(
                    SessionActivities.hand_back_home, back, **TOOL_CALL)
            else:
                home.line = await workflow.execute_activity_method(
                    SessionActivities.hand_back_files, back, **TOOL_CALL)
        except ActivityError as err:
            home.line = (f"[Keel: the files it wrote were not copied to your workspace "
                         f"({err.cause or err}); they are in session {state.session_id}'s]")
        return with_line(text, home.line), home.shown

    async def _answer(self, outcome: str, text: str, shown: Sequence[str] = ()) -> None:
        state = self.run.state
        task = state.config.delegated
        assert task is not None
        answer = AgentRunInput(run_id=task.call_id, from_session=state.session_id,
                               text=text[:ANSWER_CHARS], outcome=outcome,
                               input_id=f"delegate-answer-{state.session_id}",
                               spent=state.budget.spent, attachments=list(shown))
        if task.answer_in_result:  # the run's result: its parent hears the completion
            self.answer = answer
            self.end(f"its task is done ({outcome}); the answer is its result")
            return
        if self.told and outcome == "answered":  # its final model call told the parent
            self.end(f"its task is done ({outcome}); the answer went to "
                     f"#{task.parent_session}")
            return
        try:
            await workflow.get_external_workflow_handle(task.parent_session).signal(
                Handler.AGENT_RUN, answer)
        except Exception as err:  # the parent ended: nobody to hear it
            workflow.logger.warning("answer to %s not sent: %s", task.parent_session, err)
        self.end(f"its task is done ({outcome}); the answer went to #{task.parent_session}")

    def end(self, reason: str) -> None:
        state = self.run.state
        if not state.ended:
            state.ended = True
            state.stopped_reason = state.stopped_reason or f"the session was {reason}"
        if self.run.phase in (SessionPhase.IDLE, SessionPhase.STOPPED):
            self.run.phase = SessionPhase.ENDED

    async def parent_ended(self, args: Sequence[RawValue]) -> None:
        """`Handler.PARENT_ENDED`: the parent ended (or gave up on this child)."""
        try:
            reason = EndSession.model_validate(json.loads(args[0].payload.data)).reason
        except Exception:
            reason = "ended: its parent session ended"
        await self.run.record_notice(f"The session was {reason[:300]}.")
        self.end(reason[:300])
        self.run.publish_summary()
