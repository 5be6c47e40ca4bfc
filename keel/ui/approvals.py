"""The UI's one door to approvals: pending tool calls, approve, deny.

Approvals belong to the session and its client (`SessionHandle.pending()`, `approve()`,
`deny()`, issue 8). Until that client has them, `available()` is False and the pages show
no buttons; nothing here decides anything itself.
"""

from __future__ import annotations

from typing import Any

from keel.client import SessionHandle

DECIDED_BY = "keel ui"


class ApprovalsUnavailableError(RuntimeError):
    """This client has no approval methods yet."""


def available(handle: SessionHandle) -> bool:
    return all(callable(getattr(handle, name, None)) for name in ("pending", "approve", "deny"))


async def pending(handle: SessionHandle) -> list[Any]:
    """The session's tool calls waiting for a person ([] when approvals are not there)."""
    if not available(handle):
        return []
    return list(await handle.pending())  # type: ignore[attr-defined]


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
