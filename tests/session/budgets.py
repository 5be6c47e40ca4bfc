"""What the budget tests share with the chat, CLI, UI and interrupt tests: a tool call
(`WRITE`) in a reply whose input costs more than a small budget (`BIG_INPUT` tokens), and
waits for a session, or the first sub-agent under it, paused on its budget (`paused`,
`paused_child`)."""

from __future__ import annotations

import asyncio

from keel.client import SessionHandle
from schemas.session import SessionStatus
from tests.harness import until

WRITE = ("write_file", {"path": "notes.md", "content": "step one"})
# claude-sonnet-* at $3 / $15 per million: 100,000 input tokens are $0.30.
BIG_INPUT = 100_000


async def paused_child(session: SessionHandle) -> tuple[SessionHandle, SessionStatus]:
    """The first sub-agent under `session` paused on its budget, once there is one."""
    async def probe() -> tuple[SessionHandle, SessionStatus] | None:
        return next(((child, status) for child, status in (await session.tree_statuses())[1:]
                     if status.budget_request is not None), None)
    return await until(probe)


async def paused(session: SessionHandle, within_s: float = 20) -> SessionStatus:
    for _ in range(int(within_s / 0.05)):
        status = await session.status()
        if status.budget_request is not None:
            return status
        await asyncio.sleep(0.05)
    raise AssertionError("the session never paused on its budget")
