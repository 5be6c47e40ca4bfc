"""Branching a session in Temporal: the fork workflow and the running session's rewind
(the database side and its rules: activities.branch, schemas.branch).

Invariants:
- A fork is a workflow of its own (`ForkSession`, its id named by the request id): its one
  activity copies the origin at the point in one transaction, then it starts the new
  session's workflow with the state that copy made (the checkpoint's window start, mind,
  memo and now) and leaves it running. Asked again with the same request id, each step
  finds what the first did; the origin's workflow is never touched.
- A rewind is an Update of the session (the workflow's context is in its state): it is
  refused unless the session is idle with nothing waiting (no input, no turn), or its turn
  waits on a person's approval (`rewind-cancels-waits`), and the point is inside the
  record; then the activity marks the rows after the point rewound and restores the
  workspace, and the state points at the checkpoint the window had at the point.
- A rewind while a call waits on a person checks the point first (the activity, marking
  nothing), then cancels the wait: each waiting call is denied with the result
  "cancelled: the session was rewound to #N", the turn asks the model no more and ends,
  and only then are the rows marked. So a point the record refuses cancels nothing.
- No turn starts while a rewind runs (`rewind-holds-inputs`): an input that arrives
  meanwhile is recorded at a seq past the marked ones (or, while the rewind waited on the
  cancelled turn, kept live by name: `keep_seqs`) and its turn runs on the rewound context.
- The rewind cancels the wakeups a call in an abandoned row scheduled
  (`rewind-cancels-wakeups`; `Wakeup.seq` says which row), and ends the sub-agents still
  working that one started (`rewind-ends-children`; `ChildRun.seq`); a notice names them.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError
from temporalio.workflow import ActivityConfig, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.branch import BranchActivities
    from schemas.agent import ApprovalDecision
    from schemas.branch import (
        BRANCH_REFUSED,
        FORK_WORKFLOW,
        REWIND_DECIDER,
        ForkCopy,
        ForkDone,
        RewindDone,
        RewindInput,
        RewindRequest,
        rewind_cancelled_text,
    )
    from schemas.session import SESSION_WORKFLOW, SessionInput, SessionPhase
    from workflows.delegation import Delegation
    from workflows.failures import reason
    from workflows.inbox import Inbox
    from workflows.interrupt import Interrupter
    from workflows.options import HEARTBEAT, NEVER_RETRY
    from workflows.run import SessionRun
    from workflows.tools import ToolRunner
    from workflows.wakeups import Wakeups

__all__ = ["REWIND_CANCELS_WAITS", "REWIND_CANCELS_WAKEUPS", "REWIND_ENDS_CHILDREN",
           "REWIND_HOLDS_INPUTS", "ForkWorkflow", "Rewinder"]

# Behaviour new to sessions that may exist already (a replay of a rewind before takes the
# old path): the rewind cancels an approval wait, holds the inputs, cancels wakeups.
REWIND_CANCELS_WAITS = "rewind-cancels-waits"
REWIND_HOLDS_INPUTS = "rewind-holds-inputs"
REWIND_CANCELS_WAKEUPS = "rewind-cancels-wakeups"
# The rewind ends the sub-agents still working that a call in an abandoned row started.
REWIND_ENDS_CHILDREN = "rewind-ends-children"
SETTLED = (SessionPhase.IDLE, SessionPhase.STOPPED, SessionPhase.ENDED)

# A branch's transaction waits at most a few seconds for a lock (activities.branch) and
# is retried: a fork held up by a long write goes on once it is done.
BRANCH_CALL = ActivityConfig(
    start_to_close_timeout=timedelta(minutes=2), schedule_to_close_timeout=timedelta(minutes=10),
    heartbeat_timeout=HEARTBEAT,  # a worker lost mid-copy: retried elsewhere within seconds
    retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=500),
                             maximum_interval=timedelta(seconds=10),
                             non_retryable_error_types=[*NEVER_RETRY, BRANCH_REFUSED]))


def refusal(err: ActivityError) -> ApplicationError:
    """A branch activity's failure as the caller's refusal: its own sentence when it
    refused (BRANCH_REFUSED), else why it gave up."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type == BRANCH_REFUSED:
        return ApplicationError(cause.message, type=BRANCH_REFUSED, non_retryable=True)
    return ApplicationError(reason(err), type=BRANCH_REFUSED, non_retryable=True)


@workflow.defn(name=FORK_WORKFLOW)
class ForkWorkflow:
    @workflow.run
    async def run(self, data: ForkCopy) -> ForkDone:
        try:
            done: ForkDone = await workflow.execute_activity_method(
                BranchActivities.fork_session, data, **BRANCH_CALL)
        except ActivityError as err:
            raise refusal(err) from None
        state = done.state
        try:
            await workflow.start_child_workflow(
                SESSION_WORKFLOW,
                SessionInput(session_id=done.session_id, config=state.config, state=state),
                id=done.session_id, parent_close_policy=ParentClosePolicy.ABANDON)
        except WorkflowAlreadyStartedError:  # a retried fork: its session runs already
            pass
        return done


class Rewinder:
    """The session's rewind: the checks before, the activity, the state after."""

    def __init__(self, run: SessionRun, inbox: Inbox, tools: ToolRunner,
                 interrupts: Interrupter, wakeups: Wakeups, delegation: Delegation) -> None:
        self.run, self.inbox, self.tools = run, inbox, tools
        self.interrupts, self.wakeups, self.delegation = interrupts, wakeups, delegation

    def check(self, data: RewindRequest) -> None:
        """Refuse a rewind the session cannot take now, before anything is written."""
        run, state = self.run, self.run.state
        why: str | None = None
        if state.stopped_reason:
            why = f"this session has stopped: {state.stopped_reason}"
        elif run.rewinding:
            why = "a rewind of this session is under way: wait for it to end"
        elif state.approvals:
            why = self._wait_problem(data.to_seq)
        elif run.phase is not SessionPhase.IDLE or state.pending or state.turn_in_progress \
                or state.checkpoint_requested:
            why = (f"the session is {run.phase.value} ({len(state.pending)} input(s) "
                   "waiting): a rewind is taken only while it is idle or waiting on an "
                   "approval; wait for the turn to end")
        elif not 1 <= data.to_seq < state.next_seq:
            why = (f"seq {data.to_seq} is not in this session's record "
                   f"(#1 to #{state.next_seq - 1})")
        if why:
            raise ApplicationError(why, type=BRANCH_REFUSED, non_retryable=True)

    def _wait_problem(self, to_seq: int) -> str | None:
        """Why a rewind cannot cancel the approval wait now (None: it can): the turn must
        be waiting (not checkpointing meanwhile), and the point before the waiting call."""
        state, waiting = self.run.state, self.tools.waiting_reply_seq()
        if self.run.phase is SessionPhase.AWAITING_APPROVAL and waiting is None:
            # The call has begun to wait; the record's notice of it is being written.
            return ("a call has just begun to wait on a person and its wait is being "
                    "recorded: ask again in a moment")
        if self.run.phase is not SessionPhase.AWAITING_APPROVAL or waiting is None:
            return (f"the session is {self.run.phase.value} while "
                    f"{len(state.approvals)} approval(s) wait "
                    f"({', '.join(a.tool for a in state.approvals)}): rewind once it waits "
                    "on them again, or approve or deny first")
        if not 1 <= to_seq < waiting:
            return (f"seq {to_seq} is not before the call that waits on a person (message "
                    f"#{waiting}): a rewind that cancels the wait goes back to #1 to "
                    f"#{waiting - 1}")
        return None

    async def rewind(self, data: RewindRequest) -> RewindDone:
        run, state = self.run, self.run.state
        update = workflow.current_update_info()
        rewind_id = f"{state.session_id}/rewind/{update.id if update else workflow.uuid4()}"
        cancels = bool(state.approvals) and workflow.patched(REWIND_CANCELS_WAITS)
        run.rewinding = workflow.patched(REWIND_HOLDS_INPUTS) or cancels
        try:
            keep: list[int] = []
            if cancels:
                await self._call(RewindInput(session_id=state.session_id, to_seq=data.to_seq,
                                             upto_seq=state.next_seq - 1,
                                             rewind_id=rewind_id, check_only=True))
                await self._cancel_waits(data.to_seq)
                keep = self.inbox.input_seqs()
            done = await self._call(RewindInput(
                session_id=state.session_id, to_seq=data.to_seq, upto_seq=state.next_seq - 1,
                rewind_id=rewind_id, keep_seqs=keep))
            self._rewound(done)
        finally:
            run.rewinding = False
        if workflow.patched(REWIND_CANCELS_WAKEUPS):
            await self.wakeups.cancel_after(data.to_seq)
        if workflow.patched(REWIND_ENDS_CHILDREN):
            await self.delegation.end_after(data.to_seq)
        return done

    async def _call(self, data: RewindInput) -> RewindDone:
        try:
            done: RewindDone = await workflow.execute_activity_method(
                BranchActivities.rewind_session, data, **BRANCH_CALL)
        except ActivityError as err:
            raise refusal(err) from None
        return done

    async def _cancel_waits(self, to_seq: int) -> None:
        """Deny every waiting call with the rewind's result; wait for its turn to end
        (it asks the model no more)."""
        run, state = self.run, self.run.state
        note = rewind_cancelled_text(to_seq)
        for pending in list(state.approvals):
            self.tools.decide(ApprovalDecision(call_id=pending.call_id, approve=False,
                                               by=REWIND_DECIDER, note=note))
        self.interrupts.stop_quietly()
        await workflow.wait_condition(lambda: run.phase in SETTLED)
        if state.stopped_reason:
            raise ApplicationError(f"the session stopped while the rewind waited for its "
                                   f"turn to end: {state.stopped_reason}",
                                   type=BRANCH_REFUSED, non_retryable=True)

    def _rewound(self, done: RewindDone) -> None:
        """The state as the window had it at the point."""
        run, state = self.run, self.run.state
        found = done.checkpoint
        state.checkpoint_id = found.checkpoint_id if found else None
        state.window_start_seq = found.cut_seq if found else 1
        state.mind_text = found.mind_text if found else ""
        state.memo_text = found.memo_text if found else ""
        state.now_text = found.now_text if found else ""
        state.texts_in_store = False  # the texts above are the session's now
        state.context_tokens = found.window_tokens_after if found else 0
        state.checkpoint_count = done.checkpoint_count
        state.approvals = []  # none of the abandoned branch's survive
        run.publish_summary()
