"""The scenarios of what a session cuts or refuses: input over its window, and starts no
session can work with:

- `history-input-limits`: on a 20,000-token window, recorded under the patches
  `refuse-agent-over-window` and `mcp-tools-fit-the-window`: an agent whose MCP server
  lists 200 tools (those past the agent's half of the window left out, said in a
  notice), a Task over the input limits (recorded cut, kept whole in the workspace), a
  turn after it, and the end;
- `history-refused-config`: a start from a client that is not Keel's, with a config no
  session can work with (a reply of 0 tokens), refused by the session under the patch
  `refuse-unworkable-config`: the run fails at once, nothing written;
- `history-refused-id` (saved as `_history-refused-id`, its workflow id): the same for a
  start under an id a session may not have (a leading `_` is Keel's own workspaces'),
  under the patch `refuse-bad-session-id`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

from temporalio.client import Client, WorkflowFailureError

from keel.client import KeelClient, SessionHandle, session_config
from schemas.agent import AgentSpec
from schemas.config import KeelSettings
from schemas.mcp import McpServerSpec
from schemas.session import SESSION_WORKFLOW
from scripts.histories.common import ROOT


async def limits_scenario(keel: KeelClient, settings: KeelSettings,
                          session_id: str) -> SessionHandle:
    wide = ROOT / "tests" / "mcp" / "servers" / "wide_server.py"
    spec = AgentSpec(mcp_servers=[McpServerSpec.model_validate({
        "name": "wide", "stdio": {"command": sys.executable, "args": [str(wide), "200"]},
        "connect_s": 10, "list_s": 10, "call_s": 10})])
    session = await keel.start_session(session_id, agent=spec, config=session_config(
        settings, context_window=20_000))
    export = "".join(f"line {i}: the nightly export moved 4,200 rows\n" for i in range(3_000))
    await session.task("t-1", "Nightly export", export)
    while (status := await session.status()).turn < 1 or status.phase != "idle":
        await asyncio.sleep(0.2)
    await session.ask("Anything odd in the export?")
    await session.end()
    return session


async def refused_scenario(keel: KeelClient, settings: KeelSettings,
                           session_id: str) -> SessionHandle:
    """A start refused for its config (a reply of 0 tokens) by the session itself: sent by
    a client that is not Keel's, since Keel's own refuses it before anything starts."""
    plain = Client(keel.client.service_client, namespace=keel.client.namespace)
    handle = await plain.start_workflow(
        SESSION_WORKFLOW, {"session_id": session_id, "config": {"max_output_tokens": 0}},
        id=session_id, task_queue=settings.task_queue)
    with contextlib.suppress(WorkflowFailureError):
        await handle.result()
    return keel.session(session_id)


async def refused_id_scenario(keel: KeelClient, settings: KeelSettings,
                              session_id: str) -> SessionHandle:
    """A start under an id no session may have (`_...`: Keel's own workspaces), refused
    by the session itself, from a client that is not Keel's."""
    bad_id = f"_{session_id}"
    plain = Client(keel.client.service_client, namespace=keel.client.namespace)
    handle = await plain.start_workflow(SESSION_WORKFLOW, {"session_id": bad_id}, id=bad_id,
                                        task_queue=settings.task_queue)
    with contextlib.suppress(WorkflowFailureError):
        await handle.result()
    return keel.session(bad_id)
