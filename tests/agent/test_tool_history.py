"""The history Keel sends stays valid however the tool list changes (issue 21, defect 3):
calls of a tool the model invented, of an MCP server since removed, of a built-in a
`set_agent` dropped, and then a spec with no tools at all. The fake Messages API holds
every request to the API's rules (a `tool_use` must name a tool of the request, tool blocks
need tools), so a request that broke them would end the turn "The model call failed".
Real Temporal, PostgreSQL, the docs MCP server over stdio."""

from __future__ import annotations

import uuid

import psycopg

from schemas.agent import AgentSpec
from tests.agent.conftest import docs_stdio
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings


def blocks(request: dict, kind: str) -> list[dict]:
    return [b for m in request["messages"] for b in m["content"]
            if isinstance(b, dict) and b.get("type") == kind]


async def test_calls_of_tools_no_longer_offered_reach_the_model_as_text(
        client, database_url, fake_anthropic, tmp_path):
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    fake_anthropic.push(
        tool_use_message([("read_file", {"path": "notes.txt"}),
                          ("mcp__docs__search_docs", {"query": "refunds"}),
                          ("invented_tool", {"x": 1})]),
        text_message("looked"),          # the first turn, all three calls answered
        text_message("fewer tools now"),  # after set_agent dropped read_file and the server
        text_message("no tools at all"))  # after a spec with no tools
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"hist-{uuid.uuid4().hex[:8]}",
                                           agent=AgentSpec(mcp_servers=[docs_stdio()]))
        first = await session.ask("Look around.")
        await session.set_agent(AgentSpec(builtin_tools=["write_file"]))
        second = await session.ask("And now?")
        await session.set_agent(AgentSpec(builtin_tools=[]))
        third = await session.ask("And now, with nothing?")
    assert [first.reply_text, second.reply_text, third.reply_text] == [
        "looked", "fewer tools now", "no tools at all"]
    assert not fake_anthropic.rejections
    during, after, bare = fake_anthropic.requests[1:]
    # While the calls' tools were offered (but the invented one), they went as tool blocks.
    assert {b["name"] for b in blocks(during, "tool_use")} == {
        "read_file", "mcp__docs__search_docs"}
    # After the change, only what the request offers is a tool block; the rest is text.
    assert [t["name"] for t in after["tools"]] == ["write_file"]
    assert blocks(after, "tool_use") == [] and blocks(after, "tool_result") == []
    shown = " ".join(b["text"] for b in blocks(after, "text"))
    for name in ("read_file", "mcp__docs__search_docs", "invented_tool"):
        assert f"of {name}, a tool this request does not offer" in shown
    assert "no tool named 'invented_tool'" in shown
    assert bare["tools"] == [] and blocks(bare, "tool_use") == []
    # The record keeps the calls as the model made them.
    with psycopg.connect(database_url) as conn:
        (content,) = conn.execute(
            "SELECT content FROM messages WHERE session_id=%s AND type='assistant'"
            " ORDER BY seq LIMIT 1", (session.session_id,)).fetchone()
    assert [b["name"] for b in content if b["type"] == "tool_use"] == [
        "read_file", "mcp__docs__search_docs", "invented_tool"]
