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
- `history-carry`: the queue on a session that continues as new every 200 events, so its
  runs start from a carried state whose checkpoint texts are read back (workflows.carry);
  the last two runs are saved (`@a`: one that continues as new, `@b`: the one after);
- `history-branch`: turns, a checkpoint on request, a rewind and a turn after it, a fork
  (the fork workflow's history and the forked session's are saved beside it);
- `history-budget-interrupt`: on the fake Messages API (tests/fake_anthropic, streaming
  slowly), a session budget reached mid-turn (the pause, its notice, a raise, the turn
  finishing), a turn interrupted mid-stream by a message sent with policy `interrupt`, a
  second stopped by the `interrupt` Update, a message refused with policy `reject`, a
  turn budget refused, and the end;
- `history-budget-interrupt-activity`: the same, recorded under the patch
  `interrupt-by-activity` (the stop sent by an ordinary activity, not a local one);
- `history-rewind-waits`: on the fake Messages API, the rewind's newer paths: a rewind
  while a call waits on a person (the wait cancelled, the turn ended, a wakeup the
  abandoned branch scheduled cancelled), a message sent while a rewind runs (held, then
  answered on the rewound context), an input id of a rewound row sent again, and the end;
- `history-rewind-children`: on the fake Messages API, a rewind to before a delegate call
  whose child still works (waiting on a person): the child ended under the patch
  `rewind-ends-children`, a notice, a turn after, and the end;
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
  answer heard before it knew the child;
- `history-input-limits`: on a 20,000-token window, recorded under the patches
  `refuse-agent-over-window` and `mcp-tools-fit-the-window`: an agent whose MCP server
  lists 200 tools (those past the agent's half of the window left out, said in a
  notice), a Task over the input limits (recorded cut, kept whole in the workspace), a
  turn after it, and the end;
- `history-attachments`: on the fake Messages API, messages with files: bytes put through
  the session and a workspace file sent with the words, a file refused before the message
  is numbered (its Update rejected, nothing recorded), a message of files alone, and the
  end;
- `history-tool-files` (and its child, named by its own id): on the fake Messages API, a
  service tool (on its own worker) whose result carries files, under the patch
  `service-tool-files`: one kept and sent with the result, one too wide for the model said
  in a line; a Task with a file and a Watch whose file is refused (its words kept), under
  `background-input-files`; a delegate call whose file goes to its child with the task,
  under `delegate-files`; and the end;
- `history-handback` (and its children): a sub-agent writes a file and answers (its final
  model call copies the file home), another writes one and fails, answering at its end
  under the patch `delegate-hand-back` (the file copied home first); and the end;
- `history-refused-config`: a start from a client that is not Keel's, with a config no
  session can work with (a reply of 0 tokens), refused by the session under the patch
  `refuse-unworkable-config`: the run fails at once, nothing written;
- `history-refused-id` (saved as `_history-refused-id`, its workflow id): the same for a
  start under an id a session may not have (a leading `_` is Keel's own workspaces'),
  under the patch `refuse-bad-session-id`.

Re-record only on purpose: a change that breaks replay of the committed histories would
break every running session.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from temporalio.client import Client, WorkflowFailureError  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from examples.support.service import TASK_QUEUE as SUPPORT_QUEUE  # noqa: E402
from examples.support.service import toolset  # noqa: E402
from keel.client import (  # noqa: E402
    AttachmentRefusedError,
    KeelClient,
    SessionBusyError,
    SessionHandle,
    session_config,
)
from keel.devstack import running_stack  # noqa: E402
from keel.service import ServiceToolResult, ServiceToolset, ToolFile  # noqa: E402
from schemas.agent import (  # noqa: E402
    CHILD_NOTE,
    AgentSpec,
    ApprovalPolicy,
    ApprovalRules,
    spec_from_text,
)
from schemas.attachments import upload_path  # noqa: E402
from schemas.budget import BudgetLimits, BudgetSpec  # noqa: E402
from schemas.config import KeelSettings, ModelSettings  # noqa: E402
from schemas.initiative import SubAgent, WakeupLimits  # noqa: E402
from schemas.interrupt import InterruptPolicy  # noqa: E402
from schemas.mcp import McpServerSpec  # noqa: E402
from schemas.session import SESSION_WORKFLOW  # noqa: E402
from tests.fake_anthropic import (  # noqa: E402
    ErrorStep,
    FakeAnthropic,
    text_message,
    tool_use_message,
)
from tests.faults import DelegationFaults  # noqa: E402
from tests.queue_fixture import FIRST_REQUEST, seed_queue  # noqa: E402
from workers.worker import build_worker  # noqa: E402

OUT = ROOT / "tests" / "session" / "histories"
AGENT_SCENARIO = "history-agent-approval"
CARRY_SCENARIO = "history-carry"
BRANCH_SCENARIO = "history-branch"
BUDGET_SCENARIO = "history-budget-interrupt"
BUDGET_SCENARIOS = (BUDGET_SCENARIO, "history-budget-interrupt-activity")
LIMITS_SCENARIO = "history-input-limits"
ATTACHMENTS_SCENARIO = "history-attachments"
TOOL_FILES_SCENARIO = "history-tool-files"
HANDBACK_SCENARIO = "history-handback"
REFUSED_SCENARIO = "history-refused-config"
REFUSED_ID_SCENARIO = "history-refused-id"  # saved as `_history-refused-id.json`
LONG = " ".join(f"word{n}" for n in range(600))


async def _paused(session: SessionHandle) -> None:
    while (await session.status()).budget_request is None:
        await asyncio.sleep(0.05)


async def _streaming(fake: FakeAnthropic, nth: int) -> None:
    while len(fake.streams) <= nth or fake.streams[nth].events_sent < 4:
        await asyncio.sleep(0.02)


async def budget_scenario(keel: KeelClient, fake: FakeAnthropic,
                          session_id: str) -> SessionHandle:
    write = ("write_file", {"path": "notes.md", "content": "one"})
    fake.push(tool_use_message([write], input_tokens=100_000), text_message("Noted."))
    session = await keel.start_session(session_id, agent=AgentSpec(budget=BudgetSpec(
        session=BudgetLimits(usd=0.2), turn=BudgetLimits(output_tokens=90))))
    first = await session.send("Write the notes.")
    await _paused(session)
    await session.raise_budget(5.0, by="recorder")
    await session.wait_reply(first.seq)
    fake.stream_delay_s = 0.02
    fake.push(text_message(LONG), text_message("One line, as asked."))
    nth = len(fake.streams)
    long = await session.send("Write a long essay.")
    await _streaming(fake, nth)
    try:
        await session.send("Refused while busy.", on_busy=InterruptPolicy.REJECT)
    except SessionBusyError:
        pass
    stop = await session.send("Stop; one line.", on_busy=InterruptPolicy.INTERRUPT)
    await session.wait_reply(long.seq)
    await session.wait_reply(stop.seq)
    fake.push(text_message(LONG))
    nth = len(fake.streams)
    again = await session.send("Another long essay.")
    await _streaming(fake, nth)
    await session.interrupt()
    await session.wait_reply(again.seq)
    fake.stream_delay_s = 0.0
    fake.push(*[tool_use_message([write], input_tokens=10) for _ in range(6)])
    over = await session.send("Write it again and again.")
    await _paused(session)
    await session.refuse_budget(by="recorder", note="enough")
    await session.wait_reply(over.seq)
    await session.end()
    return session


INITIATIVE_SCENARIO = "history-initiative"
EARLY_SCENARIO = "history-initiative-early"
INITIATIVE_SCENARIOS = (INITIATIVE_SCENARIO, "history-initiative-fast",
                        "history-initiative-ahead", EARLY_SCENARIO)
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


def attachments_model(body: dict[str, Any]) -> dict[str, Any]:
    seen = sum(b.get("type") in ("image", "document") for m in body["messages"]
               for b in m["content"] if isinstance(m["content"], list))
    return text_message(f"I see {seen} file(s).")


def png(width: int, height: int) -> bytes:
    from PIL import Image  # a dev dependency, as the scripts' other test parts

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (20, 80, 160)).save(buf, "PNG")
    return buf.getvalue()


async def attachments_scenario(keel: KeelClient, settings: KeelSettings,
                               session_id: str) -> SessionHandle:
    session = await keel.start_session(session_id)
    await session.put_file("notes/plan.md", "# Plan\n- ship on Friday\n")
    await session.ask("Does the plan match the screenshot?",
                      attachments=[("screen.png", png(320, 200)), "notes/plan.md"])
    with contextlib.suppress(AttachmentRefusedError):
        await session.send("and this one?", attachments=["notes/missing.png"])
    await session.ask("", attachments=[("second.png", png(64, 64))])
    await session.ask("thanks")
    await session.end()
    return session


TICKET = png(64, 48)


def tool_files_model(body: dict[str, Any]) -> dict[str, Any]:
    if CHILD_NOTE in json.dumps(body.get("system") or ""):  # the sub-agent sees its file
        return text_message("a blue rectangle")
    last = json.dumps(body["messages"][-1]["content"])
    if "tool_result" in last or "agent run" in last:
        return text_message("I see it.")
    if "Delegate" in last:
        return tool_use_message([("delegate", {"agent": "looker", "task": "describe it",
                                               "files": [upload_path("ticket.png", TICKET)]})])
    if "Chart" not in last:
        return text_message("noted")
    return tool_use_message([("chart", {"width": 120, "height": 80})])


async def tool_files_scenario(keel: KeelClient, settings: KeelSettings,
                              session_id: str) -> SessionHandle:
    tools = ServiceToolset(task_queue=f"{settings.task_queue}-charts")

    @tools.tool(description="The day's orders as a chart.")
    async def chart(width: int, height: int) -> ServiceToolResult:
        return ServiceToolResult(text="orders", files=[
            ToolFile(name="orders.png", data=png(width, height)),
            ToolFile(name="wide.png", data=png(9000, 10))])  # refused: a line instead

    async with Worker(keel.client, task_queue=tools.task_queue,
                      activities=tools.activities()):
        session = await keel.start_session(session_id, agent=AgentSpec(
            tools=tools.declarations(),
            sub_agents=[SubAgent(name="looker", instructions="You look at images.")]))
        await session.ask("Chart today's orders.")
        await session.put_file("shots/wide.png", png(9000, 10))
        await session.task("t-1", "Ticket 1", "the customer's screenshot",
                           attachments=[("ticket.png", TICKET)])
        await session.watch("w-1", "CI", "a failing run", attachments=["shots/wide.png"])
        await session.ask("and the tickets?")  # after the background inputs' turns
        await session.ask("Delegate the ticket's screenshot.")
        [child] = (await session.status()).children
        await session.end()
    history = await keel.session(child.session_id).handle.fetch_history()
    (OUT / f"{child.session_id}.json").write_text(history.to_json())  # named by its id
    return session


def handback_model(body: dict[str, Any]) -> Any:
    last = json.dumps(body["messages"][-1]["content"])
    if CHILD_NOTE in json.dumps(body.get("system") or ""):  # a writer: a file, then its end
        if "tool_result" not in last:
            return tool_use_message([("write_file", {"path": "notes.md", "content": "3"})])
        failing = "fail" in json.dumps(body["messages"][0]["content"])
        return ErrorStep(400, message="bad request") if failing else text_message("wrote it")
    if "tool_result" in last or "Write" not in last:
        return text_message("noted")
    task = "Write the notes, and fail." if "fail" in last else "Write the notes."
    return tool_use_message([("delegate", {"agent": "writer", "task": task})])


async def handback_scenario(keel: KeelClient, settings: KeelSettings,
                            session_id: str) -> SessionHandle:
    session = await keel.start_session(session_id, agent=AgentSpec(
        sub_agents=[SubAgent(name="writer", instructions="You write notes.")]))
    await session.ask("Write the notes.")
    await session.ask("Write them again, and fail.")
    children = (await session.status()).children
    await session.end()
    for child in children:
        history = await keel.session(child.session_id).handle.fetch_history()
        (OUT / f"{child.session_id}.json").write_text(history.to_json())  # named by its id
    return session


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


async def carry_scenario(keel: KeelClient, settings: KeelSettings,
                         session_id: str) -> SessionHandle:
    seed_queue(settings.workspaces_dir / session_id, count=30)
    session = await keel.start_session(session_id, config=session_config(
        settings, context_window=8000, max_output_tokens=512,
        continue_as_new_after_events=200))
    await session.ask(FIRST_REQUEST)
    while (await session.status()).checkpoint_count < 2:
        await session.ask("continue")
    for _ in range(6):  # on past the next continue-as-new
        await session.ask("continue")
    await session.mind()  # read back by the last run
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


REWIND_SCENARIO = "history-rewind-waits"
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


REWIND_CHILDREN_SCENARIO = "history-rewind-children"
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


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["REFUND_LOG"] = str(Path(tmp) / "refunds.jsonl")  # the service's own log
        settings = KeelSettings(data_dir=Path(tmp), task_queue="keel-record")
        session_id = sys.argv[1] if len(sys.argv) > 1 else "history-queue-checkpoints"
        models = {**dict.fromkeys(INITIATIVE_SCENARIOS, initiative_model),
                  REWIND_SCENARIO: rewind_model, ATTACHMENTS_SCENARIO: attachments_model,
                  TOOL_FILES_SCENARIO: tool_files_model, HANDBACK_SCENARIO: handback_model,
                  REWIND_CHILDREN_SCENARIO: rewind_children_model}
        fake = (FakeAnthropic(models[session_id]) if session_id in models
                else FakeAnthropic()).start()
        if session_id in (*BUDGET_SCENARIOS, *models):  # a fake API on loopback
            settings = settings.model_copy(update={"model": ModelSettings(
                base_url=fake.base_url, api_key="recorder", request_timeout_s=30)})
        async with running_stack(settings) as stack:
            settings = settings.model_copy(update={"database_url": stack.database_url})
            service = toolset(SUPPORT_QUEUE)
            faults = EARLY_FAULTS if session_id == EARLY_SCENARIO else None
            async with build_worker(
                    faults.client(stack.client) if faults else stack.client, settings,
                    interceptors=[faults] if faults else []), Worker(
                    stack.client, task_queue=SUPPORT_QUEUE, activities=service.activities()):
                keel = KeelClient(stack.client, settings.task_queue, settings)
                if session_id in BUDGET_SCENARIOS:
                    session = await budget_scenario(keel, fake, session_id)
                else:
                    scenario = {AGENT_SCENARIO: agent_scenario, CARRY_SCENARIO: carry_scenario,
                                BRANCH_SCENARIO: branch_scenario,
                                LIMITS_SCENARIO: limits_scenario,
                                ATTACHMENTS_SCENARIO: attachments_scenario,
                                TOOL_FILES_SCENARIO: tool_files_scenario,
                                HANDBACK_SCENARIO: handback_scenario,
                                REFUSED_SCENARIO: refused_scenario,
                                REFUSED_ID_SCENARIO: refused_id_scenario,
                                **dict.fromkeys(INITIATIVE_SCENARIOS, initiative_scenario),
                                REWIND_SCENARIO: rewind_scenario,
                                REWIND_CHILDREN_SCENARIO: rewind_children_scenario}.get(
                                    session_id, queue_scenario)
                    session = await scenario(keel, settings, session_id)
                if session_id not in (REFUSED_SCENARIO, REFUSED_ID_SCENARIO):  # no query
                    status = await session.status()
                    print(f"{session_id}: {status.checkpoint_count} checkpoints, "
                          f"turn {status.turn}")
                OUT.mkdir(parents=True, exist_ok=True)
                if session_id == CARRY_SCENARIO:
                    runs = sorted([r async for r in stack.client.list_workflows(
                        f"WorkflowId = '{session_id}'")], key=lambda r: r.start_time)
                    for suffix, run in zip("ab", runs[-2:], strict=True):
                        history = await stack.client.get_workflow_handle(
                            session_id, run_id=run.run_id).fetch_history()
                        (OUT / f"{session_id}@{suffix}.json").write_text(history.to_json())
                else:
                    history = await session.handle.fetch_history()
                    # Named by its workflow id, which the replay test reads from the name.
                    (OUT / f"{session.session_id}.json").write_text(history.to_json())
        fake.stop()


if __name__ == "__main__":
    asyncio.run(main())
