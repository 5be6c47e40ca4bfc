"""The agent's own initiative (wakeups and delegation) on the fake Messages API:

- `history-initiative` (and its child, named by its own id): the agent's own
  initiative on the fake Messages API (tests/fake_anthropic, on loopback): a one-shot
  wakeup that fires, a recurring one that fires and expires, one a client cancels, a
  delegate call that waits for its child's answer, one that goes on, one whose child
  outlives its timeout, and the end dropping a wakeup and ending a child still working;
  with the histories of three children (answered, timed out, ended with its parent);
- `history-initiative-fast` (and its three children): the same, recorded under the
  patches `delegate-round-trip` (a waiting call hears its child's answer from the child's
  completion; a delegate call's result is written by the next model call) and
  `wakeup-fold` (a wakeup firing while idle is recorded by its turn's model call);
- `history-initiative-ahead` (and its three children): the same again, with the parent's
  model call starting the child of its reply's waiting delegate call itself and the
  child's final model call telling its parent the answer (activities.delegate_ahead): the
  answered child and the one that outlives its timeout were started ahead, the one that
  goes on is a Temporal child;
- `history-initiative-early` (and its four children): the same again under the patches
  `wakeup-recurring-floor` (a recurring wakeup at least 2 s apart) and
  `delegate-early-answer`, children started with `hears_call`, and one more waiting
  delegate call whose child cannot tell its parent from its model call (that signal
  refused, tests.faults) and answers at its end while the parent's call that started it
  is retried (its first completion lost after the child ended): the call takes the
  answer heard before it knew the child.
"""

from __future__ import annotations

import asyncio
from typing import Any

from keel.client import KeelClient, SessionHandle
from schemas.agent import CHILD_NOTE, AgentSpec, ApprovalPolicy, ApprovalRules
from schemas.config import KeelSettings
from schemas.initiative import SubAgent, WakeupLimits
from scripts.histories.common import EARLY_SCENARIO, OUT
from tests.fake_anthropic import text_message, tool_use_message
from tests.faults import DelegationFaults

# The faults of the early answer (tests.faults), armed for its one call.
EARLY_ARMED: list[bool] = [False]
EARLY_FAULTS = DelegationFaults(armed=lambda: EARLY_ARMED[0])
INITIATIVE_AGENT = AgentSpec(
    instructions="You keep track of CI and hand research to a sub-agent.",
    wakeups=WakeupLimits(min_interval_s=1, max_active=5, expiry_s=3600),
    sub_agents=[SubAgent(name="researcher", instructions="You look things up."),
                SubAgent(name="waiter", instructions="You wait for a person.", timeout_s=2)],
    approvals=ApprovalRules(tools={"write_file": ApprovalPolicy.ASK}))
# What the scripted model does for each user message (the first words pick it).
INITIATIVE_CALLS: dict[str, tuple[str, dict[str, object]]] = {
    "once": ("schedule_wakeup", {"note": "look at CI again", "after_s": 1.5}),
    "every": ("schedule_wakeup", {"note": "poll CI", "every_s": 2, "expires_in_s": 5}),
    "later": ("schedule_wakeup", {"note": "tomorrow's report", "after_s": 3000}),
    "keep": ("schedule_wakeup", {"note": "dropped at the end", "after_s": 3000}),
    "ask": ("delegate", {"agent": "researcher", "task": "What is 6 x 7?"}),
    "early": ("delegate", {"agent": "researcher", "task": "What is 3 + 4?"}),
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


async def initiative_scenario(keel: KeelClient, settings: KeelSettings,
                              session_id: str) -> SessionHandle:
    session = await keel.start_session(session_id, agent=INITIATIVE_AGENT)
    await session.ask("once: check CI shortly")
    await asyncio.sleep(3)  # it fires, and its Task gets a turn
    await session.ask("every: poll CI every two seconds for a few seconds")
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
    if session_id == EARLY_SCENARIO:
        EARLY_ARMED[0] = True
        await session.ask("early: the researcher, whose answer comes before its call")
        EARLY_ARMED[0] = False
        assert EARLY_FAULTS.lost, "the early answer's faults did not happen"
    await session.ask("keep: one for the end to drop")
    await session.ask("slow: the waiter, who outlives its timeout")
    await session.ask("last: the waiter again, still working when the session ends")
    await asyncio.sleep(1)
    children = (await session.status()).children
    await session.end()  # ends the last waiter too
    saved = [0, 2, 3] if session_id != EARLY_SCENARIO else [0, 2, 3, 4]
    for child in (children[i] for i in saved):  # answered, (early,) timed out, ended
        handle = keel.session(child.session_id).handle
        for _ in range(150):  # its end, so the whole history is replayed
            if (await handle.describe()).close_time is not None:
                break
            await asyncio.sleep(0.2)
        history = await handle.fetch_history()
        (OUT / f"{child.session_id}.json").write_text(history.to_json())  # named by its id
    return session
