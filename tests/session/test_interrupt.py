"""Interrupting on real sessions (issue 24): a message sent with policy `interrupt` while a
reply streams stops the model's stream at once (the fake server sees its client go), what
streamed is kept in the record marked interrupted, and the message starts the next turn; a
tool call already running finishes and is recorded while the calls not started get a "not
run" result; `reject` refuses with nothing recorded; `enqueue` waits as before; the stop
Update interrupts without a message; a turn paused on its budget ends when interrupted.

Real Temporal dev server, real PostgreSQL, the real SDK streaming from the fake Messages
API (slowed to 50 ms an event so a reply is still streaming when the message comes).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from temporalio.worker import Worker

from keel.client import KeelClient, SessionBusyError, SessionHandle
from keel.service import ServiceToolset
from schemas.agent import AgentSpec
from schemas.budget import BudgetLimits, BudgetSpec
from schemas.interrupt import INTERRUPTED_MARK, NOT_RUN_TEXT, InterruptPolicy
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.session.budgets import paused
from tests.session.streams import DELAY_S, LONG, streaming


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def rows(database_url: str, session_id: str) -> list[tuple[int, str, str, Any]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT seq, type, content_text, content FROM messages WHERE session_id=%s"
            " ORDER BY seq", (session_id,)).fetchall()


async def started(keel: KeelClient, name: str, **kw: Any) -> SessionHandle:
    return await keel.start_session(f"{name}-{uuid.uuid4().hex[:8]}", **kw)


async def test_interrupt_mid_stream_keeps_what_streamed_and_starts_the_next_turn(
        client, settings, fake_anthropic, database_url):
    fake_anthropic.stream_delay_s = DELAY_S
    fake_anthropic.push(text_message(LONG), text_message("Short answer, as asked."))
    async with keel_worker(client, settings) as keel:
        session = await started(keel, "interrupt")
        first = await session.send("Write a long essay.")
        await streaming(fake_anthropic)
        second = await session.send("Stop; one line instead.",
                                    on_busy=InterruptPolicy.INTERRUPT)
        stopped = await session.wait_reply(first.seq)
        answered = await session.wait_reply(second.seq)
        status = await session.status()
        said = []
        async for _, event in session.events(after=0):
            said.append(event)
            if event.type == "turn_ended":
                break
    assert [e.by_message for e in said if e.type == "turn_interrupted"] == [True]
    seen = fake_anthropic.streams[0]
    assert seen.cancelled_at is not None and seen.finished_at is None
    assert seen.events_sent < 60  # stopped well before the reply's end
    assert stopped.interrupted and stopped.input_seqs == [first.seq]
    assert stopped.reply_text.startswith("word0 word1") and stopped.reply_text.endswith(
        INTERRUPTED_MARK)
    assert answered.reply_text == "Short answer, as asked." and not answered.interrupted
    assert answered.input_seqs == [second.seq]
    record = rows(database_url, session.session_id)
    (kept,) = [r for r in record if r[1] == "assistant" and INTERRUPTED_MARK in r[2]]
    assert kept[0] == stopped.reply_seq and "word3" in kept[2] and "word299" not in kept[2]
    # The next turn's request carries the interrupted reply, then the new message.
    last = fake_anthropic.requests[-1]["messages"]
    assert INTERRUPTED_MARK in str(last[-2]) and "one line instead" in str(last[-1])
    assert status.spent.output_tokens > 0  # the interrupted reply's estimate counts


@pytest.fixture
async def slow_tool(client) -> AsyncIterator[AgentSpec]:
    """A service tool that takes a second, on its own worker."""
    queue = f"slow-tools-{uuid.uuid4().hex[:8]}"
    tools = ServiceToolset(task_queue=queue)

    @tools.tool(description="A slow step.")
    async def slow_step(what: str) -> str:
        await asyncio.sleep(1.0)
        return f"slow step done: {what}"

    async with Worker(client, task_queue=queue, activities=tools.activities()):
        yield AgentSpec(tools=tools.declarations())


async def test_interrupt_while_a_tool_runs_lets_it_finish_and_runs_no_more(
        client, settings, fake_anthropic, database_url, slow_tool):
    fake_anthropic.push(
        tool_use_message([("slow_step", {"what": "a"}),
                          ("write_file", {"path": "b.md", "content": "b"})]),
        text_message("Answering the new message."))
    async with keel_worker(client, settings) as keel:
        session = await started(keel, "interrupt-tool", agent=slow_tool)
        first = await session.send("Do the slow step, then write b.")
        for _ in range(200):  # until the slow step is running
            if [r for r in rows(database_url, session.session_id) if r[1] == "assistant"]:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        second = await session.send("Never mind b.", on_busy=InterruptPolicy.INTERRUPT)
        stopped = await session.wait_reply(first.seq)
        answered = await session.wait_reply(second.seq)
    results = [r[3] for r in rows(database_url, session.session_id) if r[1] == "tool_result"]
    assert [(r["tool"], r["is_error"]) for r in results] == [("slow_step", False),
                                                             ("write_file", True)]
    texts = [r[2] for r in rows(database_url, session.session_id) if r[1] == "tool_result"]
    assert "slow step done: a" in texts[0] and NOT_RUN_TEXT in texts[1]
    assert stopped.interrupted and stopped.input_seqs == [first.seq]
    assert answered.reply_text == "Answering the new message."
    assert len(fake_anthropic.requests) == 2  # turn 1 made no call after its tools


async def test_reject_refuses_enqueue_waits_and_stop_interrupts(
        client, settings, fake_anthropic, database_url):
    fake_anthropic.stream_delay_s = DELAY_S
    fake_anthropic.push(text_message("A short first reply, whole."),
                        text_message("Second, after the first."),
                        text_message(LONG))
    async with keel_worker(client, settings) as keel:
        session = await started(keel, "reject", agent=AgentSpec(
            on_busy=InterruptPolicy.REJECT))
        first = await session.send("First.")
        await streaming(fake_anthropic, events=2)
        with pytest.raises(SessionBusyError, match="policy is 'reject'"):
            await session.send("Refused while busy.")  # the spec's policy
        queued = await session.send("Queued.", on_busy=InterruptPolicy.ENQUEUE)
        one = await session.wait_reply(first.seq)
        two = await session.wait_reply(queued.seq)
        # The stop button: no message, the streaming reply is stopped.
        third = await session.send("Now the long one.")
        await streaming(fake_anthropic, nth=2)
        await session.interrupt()
        stopped = await session.wait_reply(third.seq)
        idle = await session.interrupt()  # idle: nothing to stop
    assert one.reply_text == "A short first reply, whole." and not one.interrupted
    assert two.reply_text == "Second, after the first." and two.input_seqs == [queued.seq]
    assert stopped.interrupted and stopped.reply_text.endswith(INTERRUPTED_MARK)
    assert idle.phase == "idle"
    users = [r[2] for r in rows(database_url, session.session_id) if r[1] == "user"]
    assert users == ["First.", "Queued.", "Now the long one."]  # the refused one is not
    assert fake_anthropic.streams[2].cancelled_at is not None


async def test_interrupt_while_paused_on_the_budget_ends_that_turn_and_the_next_asks(
        client, settings, fake_anthropic, database_url):
    fake_anthropic.push(tool_use_message([("write_file", {"path": "a.md", "content": "a"})],
                                         input_tokens=100_000),
                        text_message("Answered after a raise."))
    spec = AgentSpec(budget=BudgetSpec(session=BudgetLimits(usd=0.2)))
    async with keel_worker(client, settings) as keel:
        session = await started(keel, "interrupt-paused", agent=spec)
        first = await session.send("Write a.")
        before = (await paused(session)).budget_request
        second = await session.send("Forget a.", on_busy=InterruptPolicy.INTERRUPT)
        stopped = await session.wait_reply(first.seq)
        again = (await paused(session)).budget_request  # the new message's turn asks
        await session.raise_budget(1.0)
        answered = await session.wait_reply(second.seq)
    assert stopped.interrupted and stopped.error is not None
    assert "interrupted while it waited on its budget" in stopped.error
    assert before is not None and again is not None
    assert again.request_id != before.request_id and again.turn == before.turn + 1
    assert answered.reply_text == "Answered after a raise."
    assert len(fake_anthropic.requests) == 2


async def test_interrupt_while_a_call_waits_on_approval_denies_it(
        client, settings, fake_anthropic, database_url):
    tools = ServiceToolset(task_queue="no-worker-needed")

    @tools.tool(description="Needs a person.", approval="ask")
    async def risky(what: str) -> str:  # never runs: denied by the interrupt
        return what

    fake_anthropic.push(tool_use_message([("risky", {"what": "x"})]),
                        text_message("Doing the new thing."))
    async with keel_worker(client, settings) as keel:
        session = await started(keel, "interrupt-approval",
                                agent=AgentSpec(tools=tools.declarations()))
        first = await session.send("Do the risky thing.")
        for _ in range(300):
            if await session.pending():
                break
            await asyncio.sleep(0.05)
        second = await session.send("Do something else.", on_busy=InterruptPolicy.INTERRUPT)
        stopped = await session.wait_reply(first.seq)
        answered = await session.wait_reply(second.seq)
        assert not await session.pending()
    (result,) = [r[3] for r in rows(database_url, session.session_id) if r[1] == "tool_result"]
    assert result["is_error"] and result["by"] == "keel"
    assert stopped.interrupted and answered.reply_text == "Doing the new thing."
    assert len(fake_anthropic.requests) == 2
