"""The UI's one door to approvals: pending tool calls, approve, deny.

Approvals belong to the session and its client (`SessionHandle.tree_pending()`,
`approve()`, `deny()`); nothing here decides anything itself. Invariants: a session that
does not answer shows no pending call (the page still shows the record); every decision
made here is recorded as made `by` the UI, and carries the digest of the input the person
read.
"""

from __future__ import annotations

import asyncio
import logging

from temporalio.service import RPCError

from keel.client import KeelError, SessionHandle
from schemas.agent import PendingApproval

__all__ = ["DECIDED_BY", "decide", "pending"]

log = logging.getLogger(__name__)
PENDING_TIMEOUT_S = 3.0

DECIDED_BY = "keel ui"


async def pending(handle: SessionHandle) -> list[tuple[str, PendingApproval]]:
    """The tool calls waiting for a person in the session and the sub-agents working under
    it, by session id (a decision on the session's page reaches the sub-agent's call, as
    `keel approve` does); [] when the session does not answer: the record is still shown."""
    try:
        return list(await asyncio.wait_for(handle.tree_pending(), PENDING_TIMEOUT_S))
    except (KeelError, RPCError, TimeoutError) as err:  # no such workflow, no worker
        log.debug("pending approvals of %s: %s", handle.session_id, err)
        return []


async def decide(handle: SessionHandle, call_id: str, approved: bool, note: str = "",
                 input_digest: str | None = None) -> None:
    """Approve or deny one pending call; `input_digest` (from the page the person read) ties
    the decision to exactly the input they reviewed. A note goes with a denial only."""
    if approved:
        await handle.approve(call_id, input_digest=input_digest, by=DECIDED_BY)
    else:
        await handle.deny(call_id, note, input_digest=input_digest, by=DECIDED_BY)
