"""Calls waiting on a person, for `keel.handle.SessionHandle`: here and in the sub-agents
working under the session.

Invariant: one approver answers for a whole delegation tree: a decision for a call pending
in no session of the tree is `NotPendingError`, and the decision goes to the one session
whose call it is. Thin calls of `PENDING_APPROVALS` and `DECIDE`; nothing here holds
session logic.
"""

from __future__ import annotations

from typing import Any, Self

from temporalio.client import Client, WorkflowHandle

from keel._errors import MessageRejectedError, NotPendingError, refusals
from schemas.agent import ApprovalDecision, DecisionRecorded, PendingApproval
from schemas.session import (
    MAX_INPUT_ID_CHARS,
    MAX_NOTE_CHARS,
    Handler,
    SessionStatus,
    text_limits,
)

__all__ = ["SessionApprovals"]


class SessionApprovals:
    """Mixed into `SessionHandle`: the pending calls of its tree and their decisions."""

    handle: WorkflowHandle[Any, SessionStatus]
    client: Client

    def __init__(self, handle: WorkflowHandle[Any, SessionStatus], client: Client) -> None:
        self.handle = handle
        self.client = client

    async def _status(self) -> SessionStatus:
        async with refusals(self.handle):
            status: SessionStatus = await self.handle.query(Handler.STATUS,
                                                            result_type=SessionStatus)
        return status

    async def pending(self) -> list[PendingApproval]:
        async with refusals(self.handle):
            pending: list[PendingApproval] = await self.handle.query(
                Handler.PENDING_APPROVALS, result_type=list[PendingApproval])
        return pending

    async def tree_pending(self) -> list[tuple[str, PendingApproval]]:
        """The calls waiting on a person here and in the sub-agents still working under this
        session (delegation), by session id: one approver answers for the whole tree."""
        return [(handle.handle.id, p) for handle, status in await self.tree_statuses()
                for p in status.pending_approvals]

    async def tree_statuses(self) -> list[tuple[Self, SessionStatus]]:
        """This session's status and those of the sub-agents still working under it (and
        theirs), each with its handle: what waits on a person across the tree, approvals
        and reached budgets, in one status query a session."""
        status = await self._status()
        out = [(self, status)]
        for child in status.children:
            if child.done is None:
                out += await self._child(child.session_id).tree_statuses()
        return out

    def _child(self, session_id: str) -> Self:
        # A sub-agent's handle, of the same class (SessionHandle) as this one.
        return type(self)(self.client.get_workflow_handle(session_id), self.client)

    async def decide(self, call_id: str, approve: bool, note: str = "",
                     input_digest: str | None = None, by: str = "") -> DecisionRecorded:
        """Approve or deny a pending call, of this session or of a sub-agent working under
        it; `NotPendingError` if it is pending in neither."""
        problem = text_limits(note=(note, MAX_NOTE_CHARS), by=(by, MAX_INPUT_ID_CHARS))
        if problem:
            raise MessageRejectedError(f"the decision's {problem}")
        try:
            return await self._decide_here(call_id, approve, note, input_digest, by)
        except NotPendingError:
            holder = next((sid for sid, p in await self.tree_pending()
                           if p.call_id == call_id and sid != self.handle.id), None)
            if holder is None:
                raise
            return await self._child(holder)._decide_here(call_id, approve, note,
                                                          input_digest, by)

    async def _decide_here(self, call_id: str, approve: bool, note: str,
                           input_digest: str | None, by: str) -> DecisionRecorded:
        async with refusals(self.handle):
            done: DecisionRecorded = await self.handle.execute_update(
                Handler.DECIDE, ApprovalDecision(call_id=call_id, approve=approve, note=note,
                                                 input_digest=input_digest, by=by),
                result_type=DecisionRecorded)
        return done

    async def approve(self, call_id: str, **kw: Any) -> DecisionRecorded:
        return await self.decide(call_id, True, **kw)

    async def deny(self, call_id: str, note: str = "", **kw: Any) -> DecisionRecorded:
        return await self.decide(call_id, False, note, **kw)
