"""MCP in a real session (Temporal dev server, PostgreSQL, the fake Messages API, the worker
as `keel worker` builds it): a stdio server's process stays warm from the listing through
the session's later turns, a 5,000,000-character result reaches the model cut to its cap
with the whole text kept where the cut says (never a 5 MB Temporal payload), and no server
process is left once the worker has stopped."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from activities.workspace import open_store
from keel.client import session_config
from schemas.agent import AgentSpec
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.mcp.conftest import POOL, WIDE, results, server_pids, stdio_spec


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


async def test_a_warm_server_across_turns_and_a_5_mb_result_kept_whole(
        client, settings, fake_anthropic, database_url):
    chars = 5_000_000
    first = tool_use_message([("mcp__pool__whoami", {}), ("mcp__pool__big", {"chars": chars})])
    second = tool_use_message([("mcp__pool__whoami", {})])
    who1, big_id = (b["id"] for b in first["content"])
    (who2,) = (b["id"] for b in second["content"])
    fake_anthropic.push(first, text_message("one"), second, text_message("two"))
    spec = AgentSpec(mcp_servers=[stdio_spec(POOL, name="pool", call_s=60)])
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"warm-{uuid.uuid4().hex[:8]}", agent=spec)
        assert (await session.ask("Who and how much?")).reply_text == "one"
        assert (await session.ask("Who again?")).reply_text == "two"
        # Read from the store itself: a read through the session carries at most 768 KiB.
        kept = await open_store(settings).read(session.session_id,
                                               f".keel/results/{big_id}.txt")
        assert kept is not None and len(kept.data) == chars and kept.data == b"y" * chars
        assert len(server_pids(POOL)) == 1  # warm while the worker runs
    assert server_pids(POOL) == []  # the worker's pool closed with it
    got = results(database_url, session.session_id)
    assert got[who1][0] == got[who2][0]  # both turns' calls reached the same process
    text, content = got[big_id]
    path = f".keel/results/{big_id}.txt"
    assert text == "y" * 20_000 + (f"\n[result cut at 20000 of {chars} characters; the whole "
                                   f"result is in {path}; read it with read_file]")
    assert content["cut"] and content["whole_result"] == path and not content["is_error"]
    # The model read the cut text, not five megabytes.
    sent = json.dumps(fake_anthropic.requests[1]["messages"][-1])
    assert f"of {chars} characters" in sent and len(sent) < 100_000


async def test_mcp_tools_past_the_agents_share_of_the_window_are_left_out_and_said(
        client, settings, fake_anthropic, database_url):
    """A server listing 200 tools (~130 tokens each) to a session with a 20,000-token
    window: the tools that fit the agent's share of it are carried, in the order listed,
    the rest left out and said in the listing's notice; the turn is answered. Before,
    every request carried all of them, over the window, and the session stopped."""
    fake_anthropic.responder = lambda body: text_message("ok")
    spec = AgentSpec(mcp_servers=[stdio_spec(WIDE, name="wide", args=("200",))])
    config = session_config(settings, context_window=20_000)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"wide-{uuid.uuid4().hex[:8]}", agent=spec,
                                           config=config)
        outcome = await session.ask("Where is item K-7?")
        status = await session.status()
    assert outcome.error is None and outcome.reply_text == "ok"
    assert status.stopped_reason is None
    names = [t["name"] for t in fake_anthropic.requests[0]["tools"]
             if t["name"].startswith("mcp__wide__")]
    assert 10 < len(names) < 200
    assert names == [f"mcp__wide__tool_{i:03}" for i in range(len(names))]  # listed order
    with psycopg.connect(database_url) as conn:
        notices = [r[0] for r in conn.execute(
            "SELECT content_text FROM messages WHERE session_id=%s AND type='notice'",
            (session.session_id,)).fetchall()]
    assert any(f"{200 - len(names)} MCP tools left out (mcp__wide__tool_{len(names):03}"
               in n for n in notices), notices
