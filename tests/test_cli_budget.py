"""`keel budget` and `keel interrupt` on a real session: the spend and a paused turn's
request shown, a raise from the command line that lets the turn finish, a refusal with
nothing pending as one error line, and a stop of an idle session that changes nothing."""

from __future__ import annotations

import uuid

import pytest

from schemas.agent import AgentSpec
from schemas.budget import BudgetLimits, BudgetSpec
from tests.command_line import cli_env, keel  # noqa: F401 (a fixture)
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.session.budgets import BIG_INPUT, WRITE, paused


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


async def test_budget_and_interrupt_commands(client, settings, cli_env,  # noqa: F811
                                             fake_anthropic):
    fake_anthropic.push(tool_use_message([WRITE], input_tokens=BIG_INPUT),
                        text_message("Finished after the raise."))
    spec = AgentSpec(budget=BudgetSpec(session=BudgetLimits(usd=0.2)))
    async with keel_worker(client, settings) as workers:
        session = await workers.start_session(f"cli-budget-{uuid.uuid4().hex[:8]}",
                                              agent=spec)
        sid = session.session_id
        accepted = await session.send("Write the notes.")
        request = (await paused(session)).budget_request
        assert request is not None
        shown = await keel(cli_env, "budget", sid)
        assert "paused: the session's budget is reached" in shown
        assert request.request_id in shown and "session spent: $0.3003" in shown
        assert "(budget: $0.3003 of $0.2000, 150%)" in shown  # the limit in force
        status = await keel(cli_env, "status", sid)
        assert "awaiting_budget" in status and "$0.3003" in status
        raised = await keel(cli_env, "budget", sid, "--raise", "1", "--by", "ops")
        assert "no budget request is pending" in raised
        outcome = await session.wait_reply(accepted.seq)
        assert outcome.reply_text == "Finished after the raise."
        assert "of $1.2000" in await keel(cli_env, "budget", sid)  # what was raised counts
        refused = await keel(cli_env, "budget", sid, "--refuse", code=1)
        assert "no budget request is pending in this session" in refused
        # Amounts no budget can be raised by: one line each (a pydantic traceback was
        # printed; "inf" travelled as null, no limit, and was answered "not both").
        for bad in (["--raise", "-5"], ["--output-tokens", "-100"]):
            said = await keel(cli_env, "budget", sid, *bad, code=2)
            assert "greater than or equal to 0" in said and "Traceback" not in said
        said = await keel(cli_env, "budget", sid, "--raise", "inf", code=1)
        assert "the budget answer: usd: Input should be a finite number" in said
        stopped = await keel(cli_env, "interrupt", sid)
        assert "the session is idle" in stopped


async def test_budget_again_allows_as_much_again_of_what_was_reached(
        client, settings, cli_env, fake_anthropic):  # noqa: F811
    """`keel budget --again`: the chat's y from the command line, bound to the request
    pending; with none pending, or beside --refuse, one line."""
    fake_anthropic.push(tool_use_message([WRITE], input_tokens=BIG_INPUT),
                        text_message("Finished after as much again."))
    spec = AgentSpec(budget=BudgetSpec(session=BudgetLimits(usd=0.2)))
    async with keel_worker(client, settings) as workers:
        session = await workers.start_session(f"cli-again-{uuid.uuid4().hex[:8]}",
                                              agent=spec)
        sid = session.session_id
        accepted = await session.send("Write the notes.")
        await paused(session)
        both = await keel(cli_env, "budget", sid, "--again", "--refuse", code=2)
        assert "one of --raise (an amount), --again or --refuse" in both
        said = " ".join((await keel(cli_env, "budget", sid, "--again", "--by", "ops")).split())
        assert "allowed $0.2000 more" in said  # $0.3003 spent of $0.20: another $0.20
        outcome = await session.wait_reply(accepted.seq)
        assert outcome.reply_text == "Finished after as much again."
        none = await keel(cli_env, "budget", sid, "--again", code=1)
        assert "no budget request is pending in this session" in none
