"""Budgets on real sessions (issue 24): a session budget reached mid-turn pauses the turn
before its next model call, a raise lets the turn finish; a refused raise and a session
ended while paused end the turn saying so; a per-turn budget pauses each turn that spends
past it; a pause survives continue-as-new.

Real Temporal dev server, real PostgreSQL, the real SDK against the fake Messages API (its
usage, cache reads and writes included, priced by the worker's price table).
"""

from __future__ import annotations

import asyncio
import io
import uuid
from typing import Any

import psycopg
import pytest
from rich.console import Console

from keel.client import (
    MessageRejectedError,
    NoBudgetRequestError,
    session_config,
)
from keel.live import LiveView
from schemas.agent import AgentSpec
from schemas.budget import BudgetLimits, BudgetSpec
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.session.budgets import BIG_INPUT, WRITE, paused


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def notices(database_url: str, session_id: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        return [r[0] for r in conn.execute(
            "SELECT content_text FROM messages WHERE session_id=%s AND type='notice'"
            " ORDER BY seq", (session_id,)).fetchall()]


def tool_results(database_url: str, session_id: str) -> list[dict[str, Any]]:
    with psycopg.connect(database_url) as conn:
        return [r[0] for r in conn.execute(
            "SELECT content FROM messages WHERE session_id=%s AND type='tool_result'"
            " ORDER BY seq", (session_id,)).fetchall()]


def spec(session: BudgetLimits | None = None, turn: BudgetLimits | None = None) -> AgentSpec:
    return AgentSpec(budget=BudgetSpec(session=session, turn=turn))


async def test_budget_reached_mid_turn_pauses_then_a_raise_finishes_the_turn(
        client, settings, fake_anthropic, database_url):
    fake_anthropic.push(tool_use_message([WRITE], input_tokens=BIG_INPUT),
                        text_message("Done, within the raised budget."))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(
            f"budget-{uuid.uuid4().hex[:8]}",
            agent=spec(session=BudgetLimits(usd=0.25)))
        accepted = await session.send("Write the notes.")
        status = await paused(session)
        request = status.budget_request
        assert request is not None and request.scope == "session"
        assert status.phase == "awaiting_budget"
        assert status.spent.input_tokens == BIG_INPUT
        assert status.spent.usd == pytest.approx(0.30 + 20 * 15 / 1e6)
        assert len(fake_anthropic.requests) == 1  # no call made past the budget
        # The tool call the reply asked for was made and recorded before the pause.
        assert [r["tool"] for r in tool_results(database_url, session.session_id)] == [
            "write_file"]
        with pytest.raises(NoBudgetRequestError):
            await session.raise_budget(1.0, request_id="budget-9-9")
        await session.raise_budget(1.0, note="go on")
        outcome = await session.wait_reply(accepted.seq)
        status = await session.status()
        kinds = []
        async for _, event in session.events(after=0):
            kinds.append(event.type)
            if event.type == "turn_ended":
                break
    assert kinds.index("budget_reached") < kinds.index("budget_answered")
    assert outcome.reply_text == "Done, within the raised budget." and outcome.error is None
    assert outcome.spent is not None and outcome.spent.usd > 0.30
    assert status.budget_request is None and status.phase == "idle"
    assert len(fake_anthropic.requests) == 2
    said = notices(database_url, session.session_id)
    assert any("session's budget is reached" in n and request.request_id in n for n in said)
    assert any(f"Budget request {request.request_id}: user raised it by $1.0000 (go on)"
               in n for n in said)


async def test_refused_raise_ends_the_turn_and_an_end_while_paused_too(
        client, settings, fake_anthropic, database_url):
    fake_anthropic.push(tool_use_message([WRITE], input_tokens=BIG_INPUT),
                        tool_use_message([WRITE], input_tokens=BIG_INPUT))
    async with keel_worker(client, settings) as keel:
        refused = await keel.start_session(
            f"budget-no-{uuid.uuid4().hex[:8]}", agent=spec(session=BudgetLimits(usd=0.1)))
        accepted = await refused.send("Write the notes.")
        await paused(refused)
        await refused.refuse_budget(note="enough")
        outcome = await refused.wait_reply(accepted.seq)
        assert outcome.error is not None and "raise was refused" in outcome.error
        assert (await refused.status()).phase == "idle"
        with pytest.raises(NoBudgetRequestError):
            await refused.refuse_budget()

        ended = await keel.start_session(
            f"budget-end-{uuid.uuid4().hex[:8]}", agent=spec(session=BudgetLimits(usd=0.1)))
        accepted = await ended.send("Write the notes.")
        await paused(ended)
        # Waiting already: an ended session completes, and a wait sent after it would not
        # reach it.
        waiting = asyncio.create_task(ended.wait_reply(accepted.seq))
        await asyncio.sleep(0.2)
        final = await ended.end("ended while paused")
        outcome = await waiting
    # The waiter hears the end at once (the session has stopped), or the turn's own error.
    assert outcome.stopped_reason == "the session was ended while paused" or (
        outcome.error is not None and "ended while the turn waited" in outcome.error)
    assert final.ended
    assert len(fake_anthropic.requests) == 2  # one call each, none past the budget
    assert any("refused a raise" in n for n in notices(database_url, refused.session_id))


async def test_a_raise_that_cannot_let_the_turn_go_on_is_refused_and_changes_nothing(
        client, settings, fake_anthropic, database_url):
    """A turn paused on its output tokens: a raise in dollars (no dollar limit in force)
    and a raise of nothing are refused, saying why, the request still pending; before,
    both were taken and started a new limit (the $0 one reached at once), and the turn
    paused again."""
    fake_anthropic.push(tool_use_message([WRITE]), tool_use_message([WRITE]),
                        tool_use_message([WRITE]), text_message("Done."))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(
            f"budget-bad-raise-{uuid.uuid4().hex[:8]}",
            agent=spec(turn=BudgetLimits(output_tokens=50)))
        accepted = await session.send("Write three times.")
        request = (await paused(session)).budget_request
        assert request is not None
        with pytest.raises(MessageRejectedError, match="has no dollars limit to raise"):
            await session.raise_budget(1.0)
        with pytest.raises(MessageRejectedError, match="a raise is of more than nothing"):
            await session.raise_budget(output_tokens=0)
        status = await session.status()
        assert status.budget_request == request and status.phase == "awaiting_budget"
        await session.raise_budget(output_tokens=100)
        outcome = await asyncio.wait_for(session.wait_reply(accepted.seq), 30)
    assert outcome.reply_text == "Done."
    said = notices(database_url, session.session_id)
    assert sum("raised it by" in n for n in said) == 1


async def test_turn_budget_pauses_each_turn_that_spends_past_it(
        client, settings, fake_anthropic, database_url):
    # Per turn: 50 output tokens. A tool round costs 20, a reply 5 (the fake's counts).
    fake_anthropic.push(
        tool_use_message([WRITE]), tool_use_message([WRITE]), tool_use_message([WRITE]),
        text_message("Turn one done."),  # after a pause at 60 output tokens, raised by 100
        text_message("Turn two done."))  # a fresh turn starts from nothing
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(
            f"budget-turn-{uuid.uuid4().hex[:8]}",
            agent=spec(turn=BudgetLimits(output_tokens=50)))
        accepted = await session.send("Write three times.")
        status = await paused(session)
        assert status.budget_request is not None
        assert status.budget_request.scope == "turn"
        assert status.turn_spent.output_tokens == 60
        await session.raise_budget(output_tokens=100)
        first = await session.wait_reply(accepted.seq)
        second = await session.ask("And once more, briefly.")
        status = await session.status()
    assert first.reply_text == "Turn one done." and second.reply_text == "Turn two done."
    assert status.turn_spent.output_tokens == 5  # the second turn's own
    assert status.spent.output_tokens == 3 * 20 + 5 + 5
    assert status.budget_request is None
    assert len(fake_anthropic.requests) == 5


async def test_budget_pause_survives_continue_as_new(client, settings, fake_anthropic,
                                                     database_url):
    fake_anthropic.push(tool_use_message([WRITE], input_tokens=BIG_INPUT),
                        text_message("Done after the new run."))
    fake_anthropic.responder = lambda body: text_message("Noted.")
    config = session_config(settings, continue_as_new_after_events=40)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(
            f"budget-can-{uuid.uuid4().hex[:8]}", config=config,
            agent=spec(session=BudgetLimits(usd=0.2)))
        accepted = await session.send("Write the notes.")
        request = (await paused(session)).budget_request
        assert request is not None
        handle = client.get_workflow_handle(session.session_id)
        first_run = (await handle.describe()).run_id
        for n in range(40):  # background inputs until the run continues as new
            if (await handle.describe()).run_id != first_run:
                break
            await session.watch(f"w{n}", "Ping", f"ping {n}")
            await asyncio.sleep(0.2)
        assert (await handle.describe()).run_id != first_run
        status = await session.status()
        assert status.phase == "awaiting_budget"
        assert status.budget_request is not None
        assert status.budget_request.request_id == request.request_id
        await session.raise_budget(1.0)
        outcome = await session.wait_reply(accepted.seq)
    assert outcome.reply_text == "Done after the new run."
    said = notices(database_url, session.session_id)
    assert sum("budget is reached" in n for n in said) == 1  # the new run did not ask again


async def test_a_turn_paused_before_its_first_call_has_its_message_recorded(
        client, settings, fake_anthropic, database_url):
    fake_anthropic.push(text_message("First, over budget.", input_tokens=BIG_INPUT),
                        text_message("Second, after the raise."))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(
            f"budget-first-{uuid.uuid4().hex[:8]}", agent=spec(session=BudgetLimits(usd=0.1)))
        await session.ask("One.")  # answered; the spend is now past the budget
        asking = asyncio.create_task(session.ask("Two."))  # asked while idle: folded
        await paused(session)
        with psycopg.connect(database_url) as conn:
            users = [r[0] for r in conn.execute(
                "SELECT content_text FROM messages WHERE session_id=%s AND type='user'"
                " ORDER BY seq", (session.session_id,)).fetchall()]
        assert users == ["One.", "Two."]  # recorded before the pause, not by the call
        assert len(fake_anthropic.requests) == 1
        await session.raise_budget(1.0)
        outcome = await asking
    assert outcome.reply_text == "Second, after the raise."


async def test_a_near_budget_is_said_once_on_the_stream_and_in_the_record(
        client, settings, fake_anthropic, database_url):
    """$0.30 of a $0.35 session budget spent by the first turn: the session says so once
    (an event and a notice), before any pause; the turns after it do not say it again."""
    fake_anthropic.push(text_message("First.", input_tokens=BIG_INPUT),
                        text_message("Second.", input_tokens=1_000),
                        text_message("Third.", input_tokens=1_000))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"budget-near-{uuid.uuid4().hex[:8]}",
                                           agent=spec(session=BudgetLimits(usd=0.35)))
        for n in range(3):
            outcome = await session.ask(f"Turn {n}.")
            assert outcome.error is None and outcome.stopped_reason is None
        status = await session.status()
        near = []
        async for _, event in session.events(after=0):
            if event.type == "budget_near":
                near.append(event)
            if event.type == "turn_ended" and event.turn == 3:
                break
    assert status.budget_request is None and status.spent.usd < 0.35
    assert [(e.scope, e.limit, e.turn) for e in near] == [("session", "usd", 1)]
    said = [n for n in notices(database_url, session.session_id) if "budget is" in n]
    assert len(said) == 1 and said[0].startswith("The session's budget is 8") and \
        "of $0.3500" in said[0]
    out = io.StringIO()  # as `keel chat` and `keel send --wait` show it
    LiveView(Console(file=out, width=200, color_system=None)).show(0, near[0])
    assert "budget 86% spent (session: $0.3001 of $0.3500)" in out.getvalue()
