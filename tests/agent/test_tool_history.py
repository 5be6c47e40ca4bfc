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


def _with_ids(message: dict, *ids: str) -> dict:
    uses = [b for b in message["content"] if b["type"] == "tool_use"]
    for block, new in zip(uses, ids, strict=True):
        block["id"] = new
    return message


async def test_a_provider_that_numbers_its_calls_per_reply_loses_no_result(
        client, database_url, fake_anthropic, tmp_path):
    """A provider (or a proxy) that numbers its calls per reply, "call_0" each time, or
    names them outside the API's pattern: each call's result is recorded after it, and no
    request repeats an id (the API refuses "`tool_use` ids must be unique"). Before, the
    second "call_0" was answered with the first's result, its own was lost, and every
    later request was refused."""
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    fake_anthropic.push(
        _with_ids(tool_use_message([("read_file", {"path": "a.txt"})]), "call_0"),
        text_message("read a"),
        _with_ids(tool_use_message([("read_file", {"path": "b.txt"}),
                                    ("read_file", {"path": "c.txt"})]), "call_0", "call_0"),
        text_message("read b and c"),
        _with_ids(tool_use_message([("read_file", {"path": "d.txt"})]),
                  "functions.read_file:0"),
        text_message("read d"))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"ids-{uuid.uuid4().hex[:8]}")
        replies = [(await session.ask(text)).reply_text
                   for text in ("Read a.", "Read b and c.", "Read d.")]
    assert replies == ["read a", "read b and c", "read d"]
    assert not fake_anthropic.rejections
    last = fake_anthropic.requests[-1]
    ids = [b["id"] for b in blocks(last, "tool_use")]
    assert len(ids) == 4 and len(set(ids)) == 4
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT seq, type, content, content_text FROM messages"
                            " WHERE session_id=%s ORDER BY seq",
                            (session.session_id,)).fetchall()
    seqs = [seq for seq, *_ in rows]
    assert seqs == list(range(1, len(rows) + 1))  # no seq left empty
    answered: list[str] = []  # each call's path, when the rows after it answer it
    for at, (_, kind, content, _) in enumerate(rows):
        calls = [b for b in content or [] if kind == "assistant" and b["type"] == "tool_use"]
        for call, (_, next_kind, result, text) in zip(calls, rows[at + 1:], strict=False):
            assert next_kind == "tool_result" and result["tool_use_id"] == call["id"]
            assert f"'{call['input']['path']}'" in text  # its own result, not another's
            answered.append(call["input"]["path"])
    assert answered == ["a.txt", "b.txt", "c.txt", "d.txt"]
