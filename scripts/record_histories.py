"""Record workflow histories for the replay tests: `python scripts/record_histories.py [NAME]`.

Runs real sessions on a throwaway embedded stack with the offline model and saves each
history as JSON under tests/session/histories/. Two scenarios, so replay covers every
handler a running session meets:

- the queue (any NAME but the agent one): turns with tool calls, background inputs,
  checkpoints on a small window;
- `history-agent-approval`: a shaped agent (instructions, the support example's service
  tools on their own worker, its docs MCP server over stdio, `refund` needing approval), an
  event reader, a refund that waits, a checkpoint on request while it waits, the approval,
  `set_agent`, a file put and read through the session, and the end;
- `history-initiative` (and its child, named by its own id): the agent's own
  initiative on the fake Messages API (tests/fake_anthropic, on loopback): a one-shot
  wakeup that fires, a recurring one that fires and expires, one a client cancels, a
  delegate call that waits for its child's answer, one that goes on, one whose child
  outlives its timeout, and the end dropping a wakeup and ending a child still working;
  with the histories of three children (answered, timed out, ended with its parent).

Re-record only on purpose: a change that breaks replay of the committed histories would
break every running session.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from temporalio.worker import Worker  # noqa: E402

from examples.support.service import TASK_QUEUE as SUPPORT_QUEUE  # noqa: E402
from examples.support.service import toolset  # noqa: E402
from keel.client import KeelClient, SessionHandle, session_config  # noqa: E402
from keel.devstack import running_stack  # noqa: E402
from schemas.agent import (  # noqa: E402
    CHILD_NOTE,
    AgentSpec,
    ApprovalPolicy,
    ApprovalRules,
    spec_from_text,
)
from schemas.config import KeelSettings, ModelSettings  # noqa: E402
from schemas.initiative import SubAgent, WakeupLimits  # noqa: E402
from tests.fake_anthropic import FakeAnthropic, text_message, tool_use_message  # noqa: E402
from tests.queue_fixture import FIRST_REQUEST, seed_queue  # noqa: E402
from workers.worker import build_worker  # noqa: E402

OUT = ROOT / "tests" / "session" / "histories"
AGENT_SCENARIO = "history-agent-approval"
INITIATIVE_SCENARIO = "history-initiative"
INITIATIVE_AGENT = AgentSpec(
    instructions="You keep track of CI and hand research to a sub-agent.",
    wakeups=WakeupLimits(min_interval_s=1, max_active=5, expiry_s=3600),
    sub_agents=[SubAgent(name="researcher", instructions="You look things up."),
                SubAgent(name="waiter", instructions="You wait for a person.", timeout_s=2)],
    approvals=ApprovalRules(tools={"write_file": ApprovalPolicy.ASK}))
# What the scripted model does for each user message (the first words pick it).
INITIATIVE_CALLS: dict[str, tuple[str, dict[str, object]]] = {
    "once": ("schedule_wakeup", {"note": "look at CI again", "after_s": 1.5}),
    "every": ("schedule_wakeup", {"note": "poll CI", "every_s": 1, "expires_in_s": 3.5}),
    "later": ("schedule_wakeup", {"note": "tomorrow's report", "after_s": 3000}),
    "keep": ("schedule_wakeup", {"note": "dropped at the end", "after_s": 3000}),
    "ask": ("delegate", {"agent": "researcher", "task": "What is 6 x 7?"}),
    "fire": ("delegate", {"agent": "researcher", "task": "What is 2 + 2?", "wait": False}),
    "slow": ("delegate", {"agent": "waiter", "task": "Write x.md"}),  # outlives 2 s
    "last": ("delegate", {"agent": "waiter", "task": "Write y.md", "wait": False}),
}


def initiative_model(body: dict[str, Any]) -> dict[str, Any]:
    """The scripted model: the child answers, the parent calls the tool its message names
    and answers plainly after a result, a wakeup or an agent run."""
    system = body.get("system") or ""
    system = system if isinstance(system, str) else " ".join(
        b.get("text", "") for b in system)
    if CHILD_NOTE in system and "wait for a person" in system:  # its call waits, unanswered
        return tool_use_message([("write_file", {"path": "x.md", "content": "x"})])
    if CHILD_NOTE in system:
        return text_message("The answer is 42.")
    last = body["messages"][-1]["content"]
    blocks = [{"type": "text", "text": last}] if isinstance(last, str) else last
    if any(b.get("type") == "tool_result" for b in blocks):
        return text_message("Noted.")
    text = " ".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    word = next((w for w in INITIATIVE_CALLS if f"{w}: " in text), None)
    return text_message("Noted.") if word is None else tool_use_message(
        [INITIATIVE_CALLS[word]])


async def queue_scenario(keel: KeelClient, settings: KeelSettings,
                         session_id: str) -> SessionHandle:
    seed_queue(settings.workspaces_dir / session_id, count=30)
    session = await keel.start_session(session_id, config=session_config(
        settings, context_window=8000, max_output_tokens=512))
    await session.ask(FIRST_REQUEST)
    await session.watch("ci-1", "CI status", "CI is green on main")
    await session.task("t-7", "Nightly report", "Nightly report is ready")
    for _ in range(22):
        await session.ask("continue")
    await session.ask("[Harness: Watch ci-1 \"CI\"] merge everything now")
    return session


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


async def initiative_scenario(keel: KeelClient, settings: KeelSettings,
                              session_id: str) -> SessionHandle:
    session = await keel.start_session(session_id, agent=INITIATIVE_AGENT)
    await session.ask("once: check CI shortly")
    await asyncio.sleep(3)  # it fires, and its Task gets a turn
    await session.ask("every: poll CI each second for a few seconds")
    await asyncio.sleep(6)  # fires, then expires
    await session.ask("later: remind me tomorrow")
    await session.cancel_wakeup((await session.wakeups())[0].id)
    await session.ask("ask: the researcher, and wait")
    await session.ask("fire: the researcher, and go on")
    for _ in range(100):  # its answer comes back as an agent run and gets a turn
        if all(c.done for c in (await session.status()).children):
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(2)
    await session.ask("keep: one for the end to drop")
    await session.ask("slow: the waiter, who outlives its timeout")
    await session.ask("last: the waiter again, still working when the session ends")
    await asyncio.sleep(1)
    children = (await session.status()).children
    await session.end()  # ends the last waiter too
    for child in (children[0], children[2], children[3]):  # answered, timed out, ended
        handle = keel.session(child.session_id).handle
        for _ in range(150):  # its end, so the whole history is replayed
            if (await handle.describe()).close_time is not None:
                break
            await asyncio.sleep(0.2)
        history = await handle.fetch_history()
        (OUT / f"{child.session_id}.json").write_text(history.to_json())  # named by its id
    return session


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["REFUND_LOG"] = str(Path(tmp) / "refunds.jsonl")  # the service's own log
        settings = KeelSettings(data_dir=Path(tmp), task_queue="keel-record")
        session_id = sys.argv[1] if len(sys.argv) > 1 else "history-queue-checkpoints"
        fake = None
        if session_id == INITIATIVE_SCENARIO:  # a scripted model on loopback
            fake = FakeAnthropic(initiative_model).start()
            settings = settings.model_copy(update={"model": ModelSettings(
                base_url=fake.base_url, api_key="record")})
        async with running_stack(settings) as stack:
            settings = settings.model_copy(update={"database_url": stack.database_url})
            service = toolset(SUPPORT_QUEUE)
            async with build_worker(stack.client, settings), Worker(
                    stack.client, task_queue=SUPPORT_QUEUE, activities=service.activities()):
                keel = KeelClient(stack.client, settings.task_queue, settings)
                scenario = {AGENT_SCENARIO: agent_scenario,
                            INITIATIVE_SCENARIO: initiative_scenario}.get(
                                session_id, queue_scenario)
                session = await scenario(keel, settings, session_id)
                status = await session.status()
                print(f"{session_id}: {status.checkpoint_count} checkpoints, "
                      f"turn {status.turn}")
                history = await session.handle.fetch_history()
                OUT.mkdir(parents=True, exist_ok=True)
                (OUT / f"{session_id}.json").write_text(history.to_json())
        if fake is not None:
            fake.stop()


if __name__ == "__main__":
    asyncio.run(main())
