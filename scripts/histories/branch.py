"""The branching scenarios: a rewind and a fork, and the rewind's newer paths:

- `history-branch`: turns, a checkpoint on request, a rewind and a turn after it, a fork
  (the fork workflow's history and the forked session's are saved beside it);
- `history-rewind-waits`: on the fake Messages API, the rewind's newer paths: a rewind
  while a call waits on a person (the wait cancelled, the turn ended, a wakeup the
  abandoned branch scheduled cancelled), a message sent while a rewind runs (held, then
  answered on the rewound context), an input id of a rewound row sent again, and the end;
- `history-rewind-children`: on the fake Messages API, a rewind to before a delegate call
  whose child still works (waiting on a person): the child ended under the patch
  `rewind-ends-children`, a notice, a turn after, and the end.
"""

from __future__ import annotations

import asyncio
from typing import Any

from keel.client import KeelClient, SessionHandle
from schemas.agent import CHILD_NOTE, AgentSpec, ApprovalPolicy, ApprovalRules
from schemas.config import KeelSettings
from schemas.initiative import SubAgent, WakeupLimits
from scripts.histories.common import OUT
from tests.fake_anthropic import text_message, tool_use_message
from tests.queue_fixture import seed_queue


async def branch_scenario(keel: KeelClient, settings: KeelSettings,
                          session_id: str) -> SessionHandle:
    """Turns, a checkpoint, a rewind and a turn after it, then a fork: the origin's history
    (the caller saves it), the fork workflow's and the forked session's."""
    seed_queue(settings.workspaces_dir / session_id, count=6)
    session = await keel.start_session(session_id)
    await session.ask("Plan the release in three steps.")
    await session.ask("No, in five.")
    await session.checkpoint_now()
    after = (await session.status()).last_seq
    await session.ask("Go on.")
    await session.rewind(after)
    await session.ask("Go on, differently.")
    done = await keel.fork(session_id, at_seq=after, new_id=f"{session_id}-fork",
                           request_id="history-branch")
    fork = keel.session(done.session_id)
    await fork.ask("From the fork.")
    await fork.end()
    for name, handle in ((f"{session_id}-fork", fork.handle),
                         (f"{session_id}-forkflow",
                          keel.client.get_workflow_handle("keel-fork-history-branch"))):
        (OUT / f"{name}.json").write_text((await handle.fetch_history()).to_json())
    await session.end()
    return session


REWIND_AGENT = AgentSpec(
    wakeups=WakeupLimits(min_interval_s=1, max_active=5, expiry_s=3600),
    approvals=ApprovalRules(tools={"write_file": ApprovalPolicy.ASK}))


def rewind_model(body: dict[str, Any]) -> dict[str, Any]:
    """"wake" schedules a wakeup, "write" writes a file (which waits on a person); a tool
    result is acknowledged; anything else is echoed."""
    last = body["messages"][-1]["content"]
    blocks = [{"type": "text", "text": last}] if isinstance(last, str) else last
    if any(b.get("type") == "tool_result" for b in blocks):
        return text_message("done")
    said = next((b["text"] for b in reversed(blocks) if b.get("type") == "text"), "")
    if said.startswith("wake"):
        return tool_use_message([("schedule_wakeup", {"note": "look again", "after_s": 3000})])
    if said.startswith("write"):
        return tool_use_message([("write_file", {"path": "notes.md", "content": said})])
    return text_message(f"ok: {said[:80]}")


async def rewind_scenario(keel: KeelClient, settings: KeelSettings,
                          session_id: str) -> SessionHandle:
    """A rewind that cancels an approval wait and a wakeup, one a message arrives during,
    and an input id sent again after its row was rewound."""
    session = await keel.start_session(session_id, agent=REWIND_AGENT)
    await session.ask("hello")  # #1, #2
    await session.ask("wake me later")  # the wakeup's call at #4
    waiting = await session.send("write the notes")
    while not await session.pending():
        await asyncio.sleep(0.1)
    await session.rewind(2)  # the wait cancelled, the wakeup too
    await session.wait_reply(waiting.seq)
    first = await session.send("again", input_id="history-again")
    await session.wait_reply(first.seq)
    rewinding = asyncio.create_task(session.rewind(2))
    await asyncio.sleep(0)
    during = await session.ask("during the rewind")
    await rewinding
    print(f"{session_id}: answered during the rewind: {during.reply_text!r}")
    again = await session.send("again", input_id="history-again")
    await session.wait_reply(again.seq)
    await session.end()
    return session


REWIND_CHILDREN_AGENT = REWIND_AGENT.model_copy(update={"sub_agents": [
    SubAgent(name="researcher", instructions="You look things up.", timeout_s=600)]})


def rewind_children_model(body: dict[str, Any]) -> dict[str, Any]:
    """A child writes a file (which waits on a person); the parent delegates "delegate ..."
    without waiting, and answers the rest as `rewind_model` does."""
    system = body.get("system") or ""
    if CHILD_NOTE in (system if isinstance(system, str) else
                      " ".join(b.get("text", "") for b in system)):
        return tool_use_message([("write_file", {"path": "found.md", "content": "x"})])
    last = body["messages"][-1]["content"]
    said = last if isinstance(last, str) else next(
        (b["text"] for b in reversed(last) if b.get("type") == "text"), "")
    if said.startswith("delegate"):
        return tool_use_message([("delegate", {"agent": "researcher", "task": said,
                                               "wait": False})])
    return rewind_model(body)


async def rewind_children_scenario(keel: KeelClient, settings: KeelSettings,
                                   session_id: str) -> SessionHandle:
    """A rewind to before a delegate call whose child still works (it waits on a person):
    the child is ended and a notice names it (`rewind-ends-children`); a turn after."""
    session = await keel.start_session(session_id, agent=REWIND_CHILDREN_AGENT)
    await session.ask("hello")  # #1, #2
    await session.ask("delegate the search")  # the delegate call at #4
    await session.rewind(2)
    await session.ask("after the rewind")
    await session.end()
    return session
