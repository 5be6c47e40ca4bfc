"""The user story of issue 8, end to end: a support service starts a session with its own
instructions, two tools it serves itself from its own worker process (`lookup_order`, and
`refund`, which needs a person's approval), and a documentation MCP server over stdio. The
agent looks up the order, searches the docs, asks to refund and waits; a checkpoint is
taken while it waits; a person approves from the CLI; the refund runs once; nothing is lost.

Real Temporal dev server, real PostgreSQL, the real SDK against the fake Messages API
(answered by the offline model's rules), a real MCP server, a real second worker process.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import psycopg
import pytest
from typer.testing import CliRunner

from activities.offline import respond
from examples.support.service import toolset
from keel.cli import app
from keel.client import SessionStoppedError
from schemas.agent import AgentSpec
from tests.agent.conftest import docs_stdio
from tests.harness import keel_worker, make_settings

INSTRUCTIONS = ("You are Acme's support agent. When a customer wants money back: first "
                "call lookup_order, then search_docs for the policy, then refund the "
                "order's amount_cents. Be brief.")


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    fake_anthropic.reset(respond)  # the offline model's rules answer every request
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def record(database_url: str, session_id: str) -> list[tuple]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT seq, type, content_text, content FROM messages WHERE session_id=%s"
            " ORDER BY seq", (session_id,)).fetchall()


async def until(check, seconds: float = 30.0):
    for _ in range(int(seconds * 10)):
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError("condition not reached")


def cli(env: dict[str, str], *args: str) -> str:
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result.output


async def test_support_story(client, settings, fake_anthropic, database_url, service_queue):
    queue, refunds = service_queue
    spec = AgentSpec(instructions=INSTRUCTIONS, tools=toolset(queue).declarations(),
                     mcp_servers=[docs_stdio()])
    env = {"TEMPORAL_ADDRESS": client.service_client.config.target_host,
           "KEEL_TASK_QUEUE": settings.task_queue, "COLUMNS": "200"}
    session_id = f"support-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(session_id, agent=spec)
        accepted = await session.send("Order A-1001 arrived broken. Please refund it.")

        # The agent looked the order up, searched the docs, and now waits on the refund.
        pending = await until(session.pending)
        assert [(p.tool, p.input) for p in pending] == [
            ("refund", {"order_id": "A-1001", "amount_cents": 2599})]
        status = await session.status()
        assert status.phase == "awaiting_approval"
        assert status.pending_approvals[0].call_id == pending[0].call_id
        shown = await asyncio.to_thread(cli, env, "pending", session_id)
        assert pending[0].call_id in shown and "refund" in shown and "A-1001" in shown
        assert not refunds.exists()  # nothing refunded before a person approves

        # A checkpoint while it waits: same chain; it condenses what came before the
        # waiting call, so the call, its wait line and its result stay together.
        after = await session.checkpoint_now()
        assert after.checkpoint_count == 1
        assert after.phase == "awaiting_approval"
        assert "Current step" in await session.now()

        # A person approves from the command line; the turn goes on.
        out = await asyncio.to_thread(cli, env, "approve", session_id, pending[0].call_id)
        assert "approved" in out
        outcome = await session.wait_reply(accepted.seq)
        assert "Refunded 25.99 EUR on order A-1001" in outcome.reply_text
        assert "offline" in outcome.reply_text  # the offline model says what it is

        again = await asyncio.to_thread(CliRunner().invoke, app,
                                        ["approve", session_id, pending[0].call_id], env=env)
        assert again.exit_code == 1 and "already decided" in again.output

        # Nothing lost: every result is in the record, in the order the calls were made.
        rows = record(database_url, session_id)
        results = [(r[3]["tool"], r[3]["is_error"]) for r in rows if r[1] == "tool_result"]
        assert results == [("lookup_order", False), ("mcp__docs__search_docs", False),
                           ("refund", False)]
        docs = next(r[2] for r in rows if r[1] == "tool_result"
                    and r[3]["tool"] == "mcp__docs__search_docs")
        assert "within 30 days" in docs
        lines = [json.loads(x) for x in refunds.read_text().splitlines()]
        assert [(x["order_id"], x["amount_cents"], x["call_id"]) for x in lines] == [
            ("A-1001", 2599, pending[0].call_id)]

        # The service's instructions came after Keel's identity and rules, every request.
        system = fake_anthropic.requests[-1]["system"]
        system = system if isinstance(system, str) else " ".join(b["text"] for b in system)
        assert system.index("## Rules") < system.index(INSTRUCTIONS)
        names = [t["name"] for t in fake_anthropic.requests[-1]["tools"]]
        assert {"lookup_order", "refund", "mcp__docs__search_docs"} <= set(names)

        # The session's whole life: listed, then ended; an ended session takes no input.
        listed = await until(lambda: _listed(keel, session_id))
        assert listed.turn == 1 and listed.checkpoints == 1
        ended = await session.end()
        assert ended.ended
        final = await session.handle.result()
        assert final.phase == "ended"
        with pytest.raises(SessionStoppedError, match="ended"):
            await session.send("one more thing")
        assert "ended" in await asyncio.to_thread(cli, env, "status", session_id)
        listed = await until(lambda: _listed(keel, session_id, phase="ended"))
        assert listed.status == "completed"


async def _listed(keel, session_id: str, phase: str | None = None):
    for s in await keel.list_sessions():
        if s.session_id == session_id and (phase is None or s.phase == phase):
            return s
    return None
