"""Bad input around a session's own tools, each said in its test: what the model tried,
and the error result it gets back (the session goes on). Real Temporal, PostgreSQL, the
fake Messages API (scripted), real MCP servers (stdio and streamable HTTP), the service's
tools in a second worker process."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from keel.client import AgentSpecRefusedError, NotPendingError
from schemas.agent import AgentSpec, ApprovalPolicy, ApprovalRules, ServiceTool
from tests.agent.conftest import BAD, docs_stdio
from tests.agent.service_worker import misbehaving_toolset
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def results(database_url: str, session_id: str) -> dict[str, tuple[str, bool]]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT content_text, content FROM messages WHERE session_id=%s"
                            " AND type='tool_result' ORDER BY seq", (session_id,)).fetchall()
    return {r[1]["tool_use_id"]: (r[0], r[1]["is_error"]) for r in rows}


def ids(fake, n: int) -> list[str]:
    blocks = fake.requests[n]["messages"][-1]["content"]
    return [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]


async def test_bad_calls_become_error_results(client, settings, fake_anthropic, database_url,
                                              service_queue, docs_http):
    queue, _ = service_queue
    crashy = docs_stdio(name="bad", script=BAD, call_s=2)
    spec = AgentSpec(tools=misbehaving_toolset(queue).declarations(),
                     mcp_servers=[docs_stdio(), docs_http, crashy])
    fake_anthropic.push(
        tool_use_message([
            ("no_such_tool", {}),                                   # unknown name
            ("lookup_order", {"order": "A-1001"}),                  # field missing
            ("explode", {"reason": "test"}),                        # the tool raises
            ("slow", {"seconds": 5}),                               # outlives 1 s
            ("huge", {"size": 5000}),                               # over its 500 cap
            ("mcp__bad__crash", {}),                                # MCP server dies
            ("mcp__bad__hang", {}),                                 # MCP server hangs
            ("mcp__webdocs__search_docs", {"query": "shipping"}),   # over HTTP: fine
            ("mcp__docs__broken_lookup", {"topic": "refunds"}),     # the tool's own error
        ]),
        text_message("Noted the errors."))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"bad-{uuid.uuid4().hex[:8]}", agent=spec)
        outcome = await session.ask("Try everything.")
    assert outcome.reply_text == "Noted the errors."
    got = results(database_url, session.session_id)
    shown = ids(fake_anthropic, 1)
    unknown = next(i for i in got if i not in shown)
    assert got[unknown] == ("There is no tool named 'no_such_tool' in this session.", True)
    # A tool the request does not offer: its call and result go to the model as text.
    after = fake_anthropic.requests[1]["messages"][-1]["content"]
    assert any(b.get("type") == "text" and "no tool named 'no_such_tool'" in b["text"]
               for b in after)
    texts = [got[unknown]] + [got[i] for i in shown]
    assert "field 'order_id'" in texts[1][0] and texts[1][1]
    assert "the warehouse API is down (test)" in texts[2][0] and texts[2][1]
    assert "timed out" in texts[3][0] and texts[3][1]
    assert "[result cut at 500 of 5000 characters" in texts[4][0] and not texts[4][1]
    assert texts[5][1] and texts[6][1]  # crash, hang: clear error results, in time
    assert "Shipping" in texts[7][0] and not texts[7][1]
    assert "being rebuilt" in texts[8][0] and texts[8][1]


async def test_deny_with_note_and_decisions_bound_to_the_call(
        client, settings, fake_anthropic, database_url, service_queue):
    queue, refunds = service_queue
    from examples.support.service import toolset

    spec = AgentSpec(tools=toolset(queue).declarations())
    fake_anthropic.push(tool_use_message([("refund", {"order_id": "A-1002",
                                                      "amount_cents": 4100})]),
                        text_message("Understood, no refund."))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"deny-{uuid.uuid4().hex[:8]}", agent=spec)
        accepted = await session.send("Refund A-1002.")
        for _ in range(300):
            pending = await session.pending()
            if pending:
                break
            await asyncio.sleep(0.1)
        call = pending[0]
        with pytest.raises(NotPendingError, match="not pending"):
            await session.approve("toolu_nope")
        with pytest.raises(NotPendingError, match="the decision was for input"):
            await session.approve(call.call_id, input_digest="0" * 16)
        await session.deny(call.call_id, "Still in transit: wait for delivery.")
        await session.wait_reply(accepted.seq)
        with pytest.raises(NotPendingError, match="already decided"):
            await session.approve(call.call_id)
    text, is_error = results(database_url, session.session_id)[call.call_id]
    assert is_error and "Still in transit: wait for delivery." in text
    assert not refunds.exists()


async def test_service_worker_down_fails_clearly(client, settings, fake_anthropic,
                                                 database_url):
    tool = ServiceTool(name="lookup_order", activity="keel-tool.lookup_order",
                       task_queue=f"nobody-{uuid.uuid4().hex[:6]}", timeout_s=1,
                       schedule_to_close_s=2,
                       input_schema={"type": "object", "properties": {}})
    fake_anthropic.push(tool_use_message([("lookup_order", {})]), text_message("ok"))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"down-{uuid.uuid4().hex[:8]}",
                                           agent=AgentSpec(tools=[tool]))
        await session.ask("Look it up.")
    (text, is_error), = results(database_url, session.session_id).values()
    assert is_error and "no worker of the service answered in time" in text


@pytest.mark.parametrize("spec, said", [
    (AgentSpec(tools=[ServiceTool(name="t", activity="a", task_queue="q",
                                  input_schema={"type": "object",
                                                "properties": {"x": {"type": "nope"}}})]),
     "input schema is invalid"),
    (AgentSpec(tools=[ServiceTool(name="read_file", activity="a", task_queue="q")]),
     "declared twice"),
    (AgentSpec(provider="moon"), "provider profile 'moon' is unknown"),
    (AgentSpec(approvals=ApprovalRules(tools={"ghost": ApprovalPolicy.ASK})), "no such tool"),
])
async def test_refused_spec_starts_nothing(client, settings, spec, said):
    async with keel_worker(client, settings) as keel:
        session_id = f"refused-{uuid.uuid4().hex[:8]}"
        with pytest.raises(AgentSpecRefusedError, match=said):
            await keel.start_session(session_id, agent=spec)
        assert not await keel.session(session_id).is_running()
