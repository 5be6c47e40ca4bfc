"""A model call's part in delegation, through the Temporal client: a parent's call starts
the child of its reply's `delegate` call itself, and a child's task turn's final call
tells its parent the answer. Both shorten a delegate round trip: the parent's workflow
task that would start the child, and the child's last one before its parent hears, are
no longer between the reply and the answer.

Invariants:
- Both are optional and idempotent; the workflows' own ways remain (the parent starts the
  child, the child answers at its end), so a failure here is logged and changes nothing.
- The child's start (`schemas.delegation.child_input`) is the one the parent's workflow
  would make; its id is the call's, started once (an id running is used, a closed one is
  not reused), so a retried call, or the workflow's own start after it, finds that child.
- The answer is what the child's workflow would send at its end (the reply's text, the
  child's spend with this call's, the line naming the files it wrote, copied home first:
  activities.handback), sent only after the reply is in the record, so a retry (which
  finds the reply recorded and does not ask the model again) sends the same; the parent
  takes one answer per child.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from activities.handback import HandBack, hand_back
from activities.heartbeat import with_heartbeat
from activities.workspace import WorkspaceStore
from schemas.agent import AgentSpec
from schemas.budget import spend_of
from schemas.delegation import DelegateAhead, TellParent, ahead_call, answer_of, child_input
from schemas.handback import with_line
from schemas.messages import ModelReply
from schemas.session import SESSION_WORKFLOW, Handler

__all__ = ["child_closed", "start_ahead", "tell_parent"]

RPC_TIMEOUT = timedelta(seconds=5)


async def start_ahead(ahead: DelegateAhead | None, agent: AgentSpec | None,
                      reply: ModelReply) -> dict[str, str]:
    """The calls of `reply` whose child this call started (or found started), with the
    child's session id."""
    if ahead is None:
        return {}
    config = ahead.with_agent(agent)
    if (call := ahead_call(config, ahead.active, reply.tool_calls)) is None:
        return {}
    # What the session will have spent when its workflow runs the call: this reply too.
    spent = ahead.spent.plus(spend_of(reply.usage, reply.cost_usd))
    try:
        start = child_input(ahead.parent_session, config, call, spent,
                            answer_in_result=False)
    except ValueError:  # the workflow refuses it with the reason
        return {}
    try:
        await activity.client().start_workflow(
            SESSION_WORKFLOW, start, id=start.session_id, task_queue=activity.info().task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            request_eager_start=True, rpc_timeout=RPC_TIMEOUT)
    except WorkflowAlreadyStartedError:
        pass  # started and closed already: it is the one
    except Exception as err:  # the workflow starts it
        activity.logger.warning("child %s not started ahead: %s", start.session_id, err)
        return {}
    return {call.id: start.session_id}


async def tell_parent(session_id: str, tell: TellParent | None, reply: ModelReply,
                      store: WorkspaceStore) -> bool:
    """Whether the parent was told the answer in `reply` (a final one), the child's files
    copied home first and named at its end."""
    if tell is None or (answer := answer_of(session_id, tell, reply)) is None:
        return False
    try:
        home = await with_heartbeat(hand_back(store, HandBack(
            child_session=session_id, parent_session=tell.parent_session,
            call_id=tell.call_id, shared=tell.files, only=tell.bring_back)))
        answer.text, answer.attachments = with_line(answer.text, home.line), home.shown
        await activity.client().get_workflow_handle(tell.parent_session).signal(
            Handler.CHILD_ANSWER, answer, rpc_timeout=RPC_TIMEOUT)
    except Exception as err:  # the child's workflow answers at its end
        activity.logger.warning("answer of %s not sent to %s: %s", session_id,
                                tell.parent_session, err)
        return False
    return True


# A child closed so that its own code could not answer (a child that completes answers
# before it does; its answer may still be on its way).
_CANNOT_ANSWER = frozenset({
    WorkflowExecutionStatus.TERMINATED, WorkflowExecutionStatus.TIMED_OUT,
    WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.CANCELED})


@activity.defn
async def child_closed(child_session: str) -> str | None:
    """How a child started ahead closed without answering (its status's name), or None
    while it works (or when it completed: it answered first). The parent asks it now and
    then while it waits (workflows.delegation), for what a child workflow's completion
    would tell it at once."""
    desc = await activity.client().get_workflow_handle(child_session).describe(
        rpc_timeout=RPC_TIMEOUT)
    status = desc.status
    return status.name.lower() if status in _CANNOT_ANSWER else None
