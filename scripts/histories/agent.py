"""The shaped agent's scenario:

- `history-agent-approval`: a shaped agent (instructions, the support example's service
  tools on their own worker, its docs MCP server over stdio, `refund` needing approval), an
  event reader, a refund that waits, a checkpoint on request while it waits, the approval,
  `set_agent`, a file put and read through the session, and the end.
"""

from __future__ import annotations

import asyncio
import sys

from keel.client import KeelClient, SessionHandle
from schemas.agent import spec_from_text
from schemas.config import KeelSettings
from scripts.histories.common import ROOT


async def agent_scenario(keel: KeelClient, settings: KeelSettings,
                         session_id: str) -> SessionHandle:
    support = ROOT / "examples" / "support"
    spec = spec_from_text((support / "agent.toml").read_text(), ".toml")
    stdio = spec.mcp_servers[0].stdio
    assert stdio is not None
    stdio.command, stdio.args = sys.executable, [str(support / "docs_server.py")]
    session = await keel.start_session(session_id, agent=spec)
    seen: list[str] = []

    async def read_events() -> None:  # an event reader, as a UI or a relay would be
        async for _, event in session.events():
            seen.append(type(event).__name__)

    reader = asyncio.create_task(read_events())
    await session.put_file("notes/customer.md", "Customer prefers a refund to a voucher.\n")
    accepted = await session.send("Order A-1001 arrived broken. Please refund it.")
    while not (pending := await session.pending()):
        await asyncio.sleep(0.2)
    await session.checkpoint_now()
    await session.approve(pending[0].call_id, by="recorder")
    await session.wait_reply(accepted.seq)
    await session.set_agent(spec.model_copy(update={
        "instructions": spec.instructions + " Answer in one sentence."}))
    # The offline model calls the declared tools again for a new message: this refund is
    # denied with a note, which the model gets as the call's error result.
    again = await session.send("Thanks. Is anything else open on my account?")
    while not (pending := await session.pending()):
        await asyncio.sleep(0.2)
    await session.deny(pending[0].call_id, note="already refunded once", by="recorder")
    await session.wait_reply(again.seq)
    assert await session.read_file("notes/customer.md") is not None
    await session.end()
    await asyncio.wait_for(reader, 30)
    print(f"{session_id}: events seen {len(seen)}")
    return session
