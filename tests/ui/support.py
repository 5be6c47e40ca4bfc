"""What the UI tests share: a session whose agent waits for a person's approval."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from temporalio.client import Client

from keel.client import KeelClient, SessionHandle
from keel.demo import FIRST_REQUEST, seed_workspace
from schemas.agent import AgentSpec, ApprovalPolicy, ApprovalRules, PendingApproval
from schemas.config import KeelSettings
from tests.harness import keel_worker


@dataclass
class Waiting:
    keel: KeelClient
    handle: SessionHandle
    session_id: str
    asked_seq: int  # the message whose turn waits
    pending: list[PendingApproval]


@asynccontextmanager
async def waiting_for_approval(client: Client, settings: KeelSettings) -> AsyncIterator[Waiting]:
    """A worker and a demo session whose write_file call waits for approval (the offline
    model writes a review on the first request); `pending` is empty if none came in 30 s."""
    session_id = f"ui-ok-{uuid.uuid4().hex[:6]}"
    seed_workspace(settings.workspaces_dir / session_id)
    spec = AgentSpec(approvals=ApprovalRules(tools={"write_file": ApprovalPolicy.ASK}))
    async with keel_worker(client, settings) as keel:
        handle = await keel.start_session(session_id, agent=spec)
        accepted = await handle.send(FIRST_REQUEST)
        for _ in range(300):
            if await handle.pending():
                break
            await asyncio.sleep(0.1)
        yield Waiting(keel, handle, session_id, accepted.seq, await handle.pending())
