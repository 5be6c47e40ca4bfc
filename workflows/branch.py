"""Branching a session in Temporal: the fork workflow and the running session's rewind
(the database side and its rules: activities.branch, schemas.branch).

Invariants:
- A fork is a workflow of its own (`ForkSession`, its id named by the request id): its one
  activity copies the origin at the point in one transaction, then it starts the new
  session's workflow with the state that copy made (the checkpoint's window start, mind,
  memo and now) and leaves it running. Asked again with the same request id, each step
  finds what the first did; the origin's workflow is never touched.
- A rewind is an Update of the session (the workflow's context is in its state): it is
  refused unless the session is idle with nothing waiting (no input, no turn, no approval)
  and the point is inside the record; then the activity marks the rows after the point
  rewound and restores the workspace, and the state points at the checkpoint the window
  had at the point. Inputs that arrive while it runs keep their seqs past the marked ones
  and stay live.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, WorkflowAlreadyStartedError
from temporalio.workflow import ActivityConfig, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.branch import BranchActivities
    from schemas.branch import (
        BRANCH_REFUSED,
        FORK_WORKFLOW,
        ForkCopy,
        ForkDone,
        RewindDone,
        RewindInput,
        RewindRequest,
    )
    from schemas.session import SESSION_WORKFLOW, SessionInput, SessionPhase
    from workflows.failures import reason
    from workflows.options import HEARTBEAT, NEVER_RETRY
    from workflows.run import SessionRun

__all__ = ["ForkWorkflow", "Rewinder"]

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

    def __init__(self, run: SessionRun) -> None:
        self.run = run

    def check(self, data: RewindRequest) -> None:
        """Refuse a rewind the session cannot take now, before anything is written."""
        run, state = self.run, self.run.state
        why: str | None = None
        if state.stopped_reason:
            why = f"this session has stopped: {state.stopped_reason}"
        elif state.approvals:
            why = (f"the session is waiting on {len(state.approvals)} approval(s) "
                   f"({', '.join(a.tool for a in state.approvals)}): approve or deny first, "
                   "then rewind once the turn has ended")
        elif run.phase is not SessionPhase.IDLE or state.pending or state.turn_in_progress \
                or state.checkpoint_requested:
            why = (f"the session is {run.phase.value} ({len(state.pending)} input(s) "
                   "waiting): a rewind is taken only while it is idle; wait for the turn "
                   "to end")
        elif not 1 <= data.to_seq < state.next_seq:
            why = (f"seq {data.to_seq} is not in this session's record "
                   f"(#1 to #{state.next_seq - 1})")
        if why:
            raise ApplicationError(why, type=BRANCH_REFUSED, non_retryable=True)

    async def rewind(self, data: RewindRequest) -> RewindDone:
        run, state = self.run, self.run.state
        update = workflow.current_update_info()
        rewind_id = f"{state.session_id}/rewind/{update.id if update else workflow.uuid4()}"
        try:
            done: RewindDone = await workflow.execute_activity_method(
                BranchActivities.rewind_session,
                RewindInput(session_id=state.session_id, to_seq=data.to_seq,
                            upto_seq=state.next_seq - 1, rewind_id=rewind_id),
                **BRANCH_CALL)
        except ActivityError as err:
            raise refusal(err) from None
        found = done.checkpoint
        state.checkpoint_id = found.checkpoint_id if found else None
        state.window_start_seq = found.cut_seq if found else 1
        state.mind_text = found.mind_text if found else ""
        state.memo_text = found.memo_text if found else ""
        state.now_text = found.now_text if found else ""
        state.texts_in_store = False  # the texts above are the session's now
        state.context_tokens = found.window_tokens_after if found else 0
        state.checkpoint_count = done.checkpoint_count
        state.approvals = []  # none while idle; none of the abandoned branch's survive
        run.publish_summary()
        return done
