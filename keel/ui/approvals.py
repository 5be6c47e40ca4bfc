"""The UI's one door to approvals: pending tool calls, approve, deny.

Approvals belong to the session and its client (`SessionHandle.pending()`, `approve()`,
`deny()`, issue 8). Until that client has them, `available()` is False and the pages show
no buttons; nothing here decides anything itself.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from temporalio.service import RPCError

from keel.client import KeelError, SessionHandle

log = logging.getLogger(__name__)
PENDING_TIMEOUT_S = 3.0

DECIDED_BY = "keel ui"


class ApprovalsUnavailableError(RuntimeError):
    """This client has no approval methods yet."""


def available(handle: SessionHandle) -> bool:
    return all(callable(getattr(handle, name, None)) for name in ("pending", "approve", "deny"))


async def pending(handle: SessionHandle) -> list[Any]:
    """The session's tool calls waiting for a person ([] when approvals are not there, or
    the session does not answer: the record is still shown)."""
    if not available(handle):
        return []
    try:
        return list(await asyncio.wait_for(handle.pending(),  # type: ignore[attr-defined]
                                           PENDING_TIMEOUT_S))
    except (KeelError, RPCError, TimeoutError) as err:  # no such workflow, no worker
        log.debug("pending approvals of %s: %s", handle.session_id, err)
        return []


async def decide(handle: SessionHandle, call_id: str, approved: bool, note: str = "",
                 input_digest: str | None = None) -> None:
    """Approve or deny one pending call; `input_digest` (from the page the person read) ties
    the decision to exactly the input they reviewed."""
    if not available(handle):
        raise ApprovalsUnavailableError("this Keel client has no approvals")
    extra: dict[str, Any] = {"by": DECIDED_BY}
    if input_digest:
        extra["input_digest"] = input_digest
    if approved:
        await handle.approve(call_id, **extra)  # type: ignore[attr-defined]
    else:
        await handle.deny(call_id, note, **extra)  # type: ignore[attr-defined]
