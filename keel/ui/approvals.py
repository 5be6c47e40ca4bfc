"""The UI's one door to approvals: pending tool calls, approve, deny.

Approvals belong to the session and its client (`SessionHandle.tree_statuses()`,
`approve()`, `deny()`); nothing here decides anything itself. Invariants: a session that
does not answer shows no pending call (the page still shows the record); every decision
made here is recorded as made `by` the UI, and carries the digest of the input the person
read.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from temporalio.service import RPCError

from keel.client import KeelError, SessionHandle
from schemas.agent import PendingApproval
from schemas.budget import BudgetRequest

__all__ = ["DECIDED_BY", "Waiting", "decide", "pending"]

log = logging.getLogger(__name__)
PENDING_TIMEOUT_S = 3.0

DECIDED_BY = "keel ui"


@dataclass
class Waiting:
    """What waits on a person in a session and the sub-agents working under it."""

    calls: list[tuple[str, PendingApproval]] = field(default_factory=list)  # by session id
    # A sub-agent paused on its budget holds the turn too; it is answered on its own page
    # (the session's own pause has its form on the page already).
    budgets: list[tuple[str, BudgetRequest]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.calls or self.budgets)


async def pending(handle: SessionHandle) -> Waiting:
    """The tool calls waiting for a person in the session and the sub-agents working under
    it, by session id (a decision on the session's page reaches the sub-agent's call, as
    `keel approve` does), and the sub-agents paused on their budgets; nothing when the
    session does not answer: the record is still shown."""
    try:
        tree = await asyncio.wait_for(handle.tree_statuses(), PENDING_TIMEOUT_S)
    except (KeelError, RPCError, TimeoutError) as err:  # no such workflow, no worker
        log.debug("pending approvals of %s: %s", handle.session_id, err)
        return Waiting()
    return Waiting(
        calls=[(h.session_id, p) for h, status in tree for p in status.pending_approvals],
        budgets=[(h.session_id, status.budget_request) for h, status in tree[1:]
                 if status.budget_request is not None])


async def decide(handle: SessionHandle, call_id: str, approved: bool, note: str = "",
                 input_digest: str | None = None) -> None:
    """Approve or deny one pending call; `input_digest` (from the page the person read) ties
    the decision to exactly the input they reviewed. A note goes with a denial only."""
    if approved:
        await handle.approve(call_id, input_digest=input_digest, by=DECIDED_BY)
    else:
        await handle.deny(call_id, note, input_digest=input_digest, by=DECIDED_BY)
