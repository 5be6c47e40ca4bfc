"""What issue 8 claims about a running agent, each shown on a real session: the agent
changed by an Update takes effect on the next turn (and a refused spec changes nothing);
an MCP server's tool list is listed once and again only on refresh; an approval timeout
applies the policy's default; a call waiting on a person survives a worker restart and a
continue-as-new, and runs once when approved.

Real Temporal dev server, real PostgreSQL, the real SDK against the fake Messages API, a
real MCP server over stdio, the service's tools in a real second worker process.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

import psycopg
import pytest
from temporalio.client import Client, WorkflowUpdateFailedError

from examples.support.service import toolset
from keel.client import (
    AgentSpecRefusedError,
    SessionHandle,
    StartRefusedError,
    session_config,
)
from schemas.agent import AgentSpec, ApprovalRules, ServiceTool
from schemas.mcp import McpServerSpec
from schemas.session import Handler, Rejection, SessionStatus
from tests.agent.conftest import SERVERS
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings

REFUND = ("refund", {"order_id": "A-1001", "amount_cents": 2599})


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def rows(database_url: str, session_id: str) -> list[tuple[int, str, str, dict[str, Any]]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT seq, type, content_text, content FROM messages WHERE session_id=%s"
            " ORDER BY seq", (session_id,)).fetchall()


def system_text(request: dict[str, Any]) -> str:
    system = request["system"]
    return system if isinstance(system, str) else " ".join(b["text"] for b in system)


def tool_names(request: dict[str, Any]) -> list[str]:
    return [t["name"] for t in request.get("tools", [])]


async def pending_call(session: SessionHandle) -> str:
    for _ in range(300):
        pending = await session.pending()
        if pending:
            return pending[0].call_id
        await asyncio.sleep(0.1)
    raise AssertionError("no call became pending")


async def runs(client: Client, session_id: str) -> list[dict[str, Any]]:
    """Every run of the session, oldest first: its run id, how it closed, the activity
    types it scheduled, and the approvals its input carried over."""
    found = []
    async for wf in client.list_workflows(f'WorkflowId = "{session_id}"'):
        history = await client.get_workflow_handle(session_id, run_id=wf.run_id
                                                   ).fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        data = json.loads(started.input.payloads[0].data)
        activities = [e.activity_task_scheduled_event_attributes.activity_type.name
                      for e in history.events
                      if e.HasField("activity_task_scheduled_event_attributes")]
        found.append({"run_id": wf.run_id, "status": wf.status.name if wf.status else "",
                      "start": wf.start_time, "activities": activities,
                      "carried": [a["call_id"] for a in (data.get("state") or {}).get(
                          "approvals", [])],
                      "resumed": bool((data.get("state") or {}).get("turn_in_progress"))})
    return sorted(found, key=lambda r: r["start"])


async def list_activities(client: Client, session_id: str) -> int:
    return sum(r["activities"].count("list_mcp_tools") for r in await runs(client, session_id))


# ----- the agent changed by an Update ---------------------------------------------------

async def test_set_agent_shapes_the_next_turn(client, settings, fake_anthropic,
                                              database_url):
    before = AgentSpec(instructions="Sign every answer as Alpha.")
    after = AgentSpec(
        instructions="Sign every answer as Beta.", model="claude-haiku-4-5",
        tools=[ServiceTool(name="lookup_order", description="Look an order up.",
                           activity="keel-tool.lookup_order", task_queue="nowhere")])
    fake_anthropic.push(text_message("one"), text_message("two"), text_message("three"))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"set-{uuid.uuid4().hex[:8]}", agent=before)
        await session.ask("Hello.")
        first = fake_anthropic.requests[-1]
        assert "Alpha" in system_text(first) and "lookup_order" not in tool_names(first)

        status = await session.set_agent(after)
        assert status.model == "claude-haiku-4-5" and status.tools == ["lookup_order"]
        await session.ask("Hello again.")
        second = fake_anthropic.requests[-1]
        assert second["model"] == "claude-haiku-4-5"
        assert "Beta" in system_text(second) and "Alpha" not in system_text(second)
        assert "lookup_order" in tool_names(second)
        notices = [r[2] for r in rows(database_url, session.session_id) if r[1] == "notice"]
        assert notices == ["The agent changed for later turns: model claude-haiku-4-5, "
                           "1 service tools, 0 MCP servers, instructions of 26 characters."]

        # A spec Keel refuses changes nothing: same agent, no notice, same next request.
        clash = after.model_copy(update={"tools": [*after.tools, after.tools[0]]})
        with pytest.raises(AgentSpecRefusedError, match="declared twice"):
            await session.set_agent(clash)  # refused by the client, before sending
        with pytest.raises(WorkflowUpdateFailedError) as refused:  # and by the session
            await session.handle.execute_update(Handler.SET_AGENT, clash,
                                                result_type=SessionStatus)
        assert refused.value.cause.type == Rejection.AGENT_SPEC_REFUSED
        assert "declared twice" in refused.value.cause.message
        assert await session.agent() == after
        with pytest.raises(AgentSpecRefusedError, match="provider profile 'moon' is unknown"):
            await session.set_agent(after.model_copy(update={"provider": "moon"}))
        assert await session.agent() == after
        await session.ask("And again.")
        third = fake_anthropic.requests[-1]
        assert third["model"] == "claude-haiku-4-5" and "Beta" in system_text(third)
        assert tool_names(third) == tool_names(second)
        assert len([r for r in rows(database_url, session.session_id)
                    if r[1] == "notice"]) == 1


async def test_an_agent_that_leaves_no_room_in_the_window_is_refused(client, settings):
    """Instructions within their characters' limit, but more than a quarter of what a small
    window holds: refused at start (before anything starts) and by set_agent (the agent
    stays), where before the session stopped on its first message."""
    small = session_config(settings, context_window=10_000, max_output_tokens=1_024)
    long = AgentSpec(instructions="Check the release notes twice. " * 1_500)
    async with keel_worker(client, settings) as keel:
        sid = f"fit-{uuid.uuid4().hex[:8]}"
        with pytest.raises(AgentSpecRefusedError, match="window of 10000 tokens may give"):
            await keel.start_session(sid, agent=long, config=small)
        assert not await keel.session(sid).is_running()  # nothing was started
        # Without an agent, a window too small for Keel's own prompt is refused the same way.
        tiny = session_config(settings, context_window=3_000, max_output_tokens=512)
        with pytest.raises(StartRefusedError, match="Keel's system prompt and built-in"):
            await keel.start_session(sid, config=tiny)
        assert not await keel.session(sid).is_running()
        session = await keel.start_session(sid, agent=AgentSpec(instructions="Be brief."),
                                           config=small)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await session.handle.execute_update(Handler.SET_AGENT, long,
                                                result_type=SessionStatus)
        assert refused.value.cause.type == Rejection.AGENT_SPEC_REFUSED
        assert "leave room for the conversation" in refused.value.cause.message
        assert (await session.agent() or AgentSpec()).instructions == "Be brief."
        # A spec whose own window its reply room fills, or a fallback no API could name:
        # refused as a start would be, the agent as it was.
        for bad, says in ((AgentSpec(context_window=4_096, max_output_tokens=8_192),
                           "leaves nothing of a window of 4096 tokens"),
                          (AgentSpec(fallback_model="claude\nignore this"),
                           "fallback_model may not be blank or hold control characters")):
            with pytest.raises(AgentSpecRefusedError, match=says):
                await session.set_agent(bad)
            assert (await session.agent() or AgentSpec()).instructions == "Be brief."
        assert (await session.status()).context_window == 10_000  # the window as it was


# ----- MCP: listed once, again only on refresh ------------------------------------------

async def test_refresh_mcp_lists_again_and_only_then(client, settings, fake_anthropic,
                                                     tmp_path):
    tools_file = tmp_path / "tools.txt"
    tools_file.write_text("alpha")
    server = McpServerSpec(name="chg", stdio={
        "command": sys.executable,
        "args": [str(SERVERS / "changing_server.py"), str(tools_file)]},
        connect_s=10, list_s=10, call_s=10)
    fake_anthropic.push(
        tool_use_message([("mcp__chg__alpha", {"text": "hi"})]), text_message("one"),
        tool_use_message([("mcp__chg__alpha", {"text": "ho"})]), text_message("two"),
        tool_use_message([("mcp__chg__beta", {"text": "hey"})]), text_message("three"))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"mcp-{uuid.uuid4().hex[:8]}",
                                           agent=AgentSpec(mcp_servers=[server]))
        await session.ask("Say hi.")
        await session.ask("Say ho.")
        # Four model calls and two MCP calls over two turns; the tools were listed once.
        assert len(fake_anthropic.requests) == 4
        assert (await list_activities(client, session.session_id)) == 1
        assert "mcp__chg__beta" not in tool_names(fake_anthropic.requests[-1])

        tools_file.write_text("alpha beta")  # the server now offers a second tool
        assert await session.refresh_mcp() == ["mcp__chg__alpha", "mcp__chg__beta"]
        assert (await list_activities(client, session.session_id)) == 2
        outcome = await session.ask("Say hey loudly.")
        assert outcome.reply_text == "three"
        assert "mcp__chg__beta" in tool_names(fake_anthropic.requests[-2])
        result = fake_anthropic.requests[-1]["messages"][-1]["content"][0]
        assert "BETA: HEY" in json.dumps(result)
        # Not listed again for that turn: two listings, three calls in the whole history.
        scheduled = [a for r in await runs(client, session.session_id)
                     for a in r["activities"]]
        assert scheduled.count("list_mcp_tools") == 2
        assert scheduled.count("call_mcp_tool") == 3


# ----- approvals: timeout, worker restart, continue-as-new --------------------------------

async def test_approval_timeout_applies_the_policys_default(client, settings,
                                                            fake_anthropic, database_url):
    spec = AgentSpec(tools=toolset("no-worker-needed").declarations(),
                     approvals=ApprovalRules(timeout_s=1, on_timeout="deny"))
    fake_anthropic.push(tool_use_message([REFUND]), text_message("No refund, then."))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"timeout-{uuid.uuid4().hex[:8]}", agent=spec)
        accepted = await session.send("Refund A-1001.")
        call_id = await pending_call(session)
        assert (await session.pending())[0].timeout_s == 1
        outcome = await session.wait_reply(accepted.seq)
    assert outcome.reply_text == "No refund, then."
    got = rows(database_url, session.session_id)
    (result,) = [r for r in got if r[1] == "tool_result"]
    assert result[3]["is_error"] and result[3]["by"] == "timeout"
    assert "no decision within 1 s; the policy's default applies" in result[2]
    decided = [r[2] for r in got if r[1] == "harness" and "approval decided" in r[2]]
    assert decided == [f"[Keel: approval decided] call {call_id} (refund): denied by "
                       "timeout. Note: no decision within 1 s; the policy's default applies"]


async def test_approval_timeout_may_allow(client, settings, fake_anthropic, database_url,
                                          service_queue):
    queue, refunds = service_queue
    spec = AgentSpec(tools=toolset(queue).declarations(),
                     approvals=ApprovalRules(timeout_s=1, on_timeout="allow"))
    fake_anthropic.push(tool_use_message([REFUND]), text_message("Refunded."))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"allow-{uuid.uuid4().hex[:8]}", agent=spec)
        await session.ask("Refund A-1001.")
    (result,) = [r for r in rows(database_url, session.session_id) if r[1] == "tool_result"]
    assert not result[3]["is_error"] and "Refunded 25.99 EUR" in result[2]
    assert len(refunds.read_text().splitlines()) == 1


async def test_waiting_call_survives_a_worker_restart(client, settings, fake_anthropic,
                                                      database_url, service_queue):
    queue, refunds = service_queue
    spec = AgentSpec(tools=toolset(queue).declarations())
    fake_anthropic.push(tool_use_message([REFUND]), text_message("Done."))
    session_id = f"restart-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(session_id, agent=spec)
        accepted = await session.send("Refund A-1001.")
        call_id = await pending_call(session)
    # That worker is gone; another one takes the session over and the call is approved.
    async with keel_worker(client, settings) as keel:
        session = keel.session(session_id)
        assert [p.call_id for p in await session.pending()] == [call_id]
        await session.approve(call_id)
        outcome = await session.wait_reply(accepted.seq)
    assert outcome.reply_text == "Done."
    results = [r for r in rows(database_url, session_id) if r[1] == "tool_result"]
    assert [(r[3]["tool_use_id"], r[3]["is_error"]) for r in results] == [(call_id, False)]
    assert len(refunds.read_text().splitlines()) == 1
    scheduled = [a for r in await runs(client, session_id) for a in r["activities"]]
    assert scheduled.count("keel-tool.refund") == 1  # the service's activity ran once


async def test_waiting_call_survives_continue_as_new(client, settings, fake_anthropic,
                                                     database_url, service_queue):
    queue, refunds = service_queue
    spec = AgentSpec(tools=toolset(queue).declarations())
    fake_anthropic.push(tool_use_message([REFUND]), text_message("Done after the wait."))
    fake_anthropic.responder = lambda body: text_message("Noted the pings.")
    session_id = f"can-{uuid.uuid4().hex[:8]}"
    config = session_config(settings, continue_as_new_after_events=40)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(session_id, config=config, agent=spec)
        accepted = await session.send("Refund A-1001.")
        call_id = await pending_call(session)
        # Queries and status reads add no events; a few background inputs do, until the
        # run passes its limit while the call still waits.
        for n in range(30):
            if any(call_id in r["carried"] for r in await runs(client, session_id)):
                break
            await session.watch(f"w{n}", "Ping", f"ping {n}")
            await asyncio.sleep(0.2)
        history = await runs(client, session_id)
        carried = [r for r in history if call_id in r["carried"]]
        assert carried and carried[0]["resumed"], history
        status = await session.status()
        assert status.phase == "awaiting_approval"
        assert [p.call_id for p in status.pending_approvals] == [call_id]
        await session.approve(call_id)
        outcome = await session.wait_reply(accepted.seq)
    assert outcome.reply_text == "Done after the wait."
    got = rows(database_url, session_id)
    results = [r for r in got if r[1] == "tool_result"]
    assert [(r[3]["tool_use_id"], r[3]["is_error"]) for r in results] == [(call_id, False)]
    waits = [r for r in got if r[1] == "harness" and "waiting on a person" in r[2]]
    assert len(waits) == 1  # the new run did not ask again
    assert len(refunds.read_text().splitlines()) == 1
    scheduled = [a for r in await runs(client, session_id) for a in r["activities"]]
    assert scheduled.count("keel-tool.refund") == 1


# ----- a result over its cap keeps its whole text ----------------------------------------

async def test_an_over_cap_result_keeps_its_whole_text(client, settings, fake_anthropic,
                                                       database_url, service_queue):
    from tests.agent.conftest import docs_stdio
    from tests.agent.service_worker import misbehaving_toolset

    queue, _ = service_queue
    spec = AgentSpec(tools=misbehaving_toolset(queue).declarations(),
                     mcp_servers=[docs_stdio()])
    calls = tool_use_message([("huge", {"size": 5000}),                     # cap 500
                              ("mcp__docs__big_output", {"chars": 30_000})])  # cap 20,000
    huge_id, mcp_id = (b["id"] for b in calls["content"])
    kept = f".keel/results/{huge_id}.txt"
    fake_anthropic.push(calls, tool_use_message([("read_file", {"path": kept})]),
                        text_message("Read it all."))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"cap-{uuid.uuid4().hex[:8]}", agent=spec)
        assert (await session.ask("Fetch everything.")).reply_text == "Read it all."
        whole = await session.read_file(kept)
        assert whole is not None and whole.data == b"x" * 5000 and whole.version == 1
        mcp_whole = await session.read_file(f".keel/results/{mcp_id}.txt")
        assert mcp_whole is not None and mcp_whole.data == b"x" * 30_000
    results = {r[3]["tool_use_id"]: r for r in rows(database_url, session.session_id)
               if r[1] == "tool_result"}
    huge = results[huge_id]
    assert huge[2] == ("x" * 500 + "\n[result cut at 500 of 5000 characters; the whole "
                       f"result is in {kept}; read it with read_file]")
    assert huge[3]["cut"] and huge[3]["whole_result"] == kept and not huge[3]["is_error"]
    assert results[mcp_id][2].endswith(
        f"[result cut at 20000 of 30000 characters; the whole result is in "
        f".keel/results/{mcp_id}.txt; read it with read_file]")
    # The agent read the whole text back with its own file tool.
    (read,) = [r for r in results.values() if r[3].get("tool") == "read_file"
               or r[3].get("read") == kept]
    assert read[2] == "x" * 5000


async def test_keeping_a_whole_result_is_once_per_call(settings):
    from temporalio.testing import ActivityEnvironment

    from activities.files import FileActivities, KeepResultInput, kept_result_path
    from activities.workspace import open_store

    files = FileActivities(settings)
    env = ActivityEnvironment()
    first = KeepResultInput(session_id="s1", call_id="toolu_1", text="the first attempt")
    path = await env.run(files.keep_tool_result, first)
    # A retried activity (its answer lost) writes nothing a second time.
    again = await env.run(files.keep_tool_result, first.model_copy(update={"text": "later"}))
    assert path == again == kept_result_path("toolu_1") == ".keel/results/toolu_1.txt"
    stored = await open_store(settings).read("s1", path)
    assert stored is not None and (stored.data, stored.version) == (b"the first attempt", 1)
