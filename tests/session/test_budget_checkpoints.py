"""A session's budget counts every model call it makes: the checkpoint's rounds, its repair
and the memory flush before it, as the API counted them (one asked for between turns on the
session's spend only), and a budget they reach pauses the turn before the call they made
room for.

Real Temporal dev server, real PostgreSQL, the real SDK against the fake Messages API, whose
own record of the usage it returned (`usages`) is the count the session is held to.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from keel.client import SessionHandle, session_config
from schemas.agent import AgentSpec
from schemas.budget import BudgetLimits, BudgetSpec
from schemas.session import SessionStatus, TurnOutcome
from tests.checkpoint_model import MARKER, CheckpointModel, good_checkpoint
from tests.harness import keel_worker, make_settings

WINDOW, OUTPUT = 12_000, 512
BLOCK = " ".join(f"w{i % 97}" for i in range(1_500))  # about 3,000 tokens
FLUSH = "<keel:rollup"
# claude-sonnet list prices, dollars per million tokens (read off the price list, not
# from Keel's table): input, output, cache read, cache write (five minutes).
PRICE = {"input": 3.0, "output": 15.0, "read": 0.30, "write": 3.75}


def _settings(database_url: str, tmp_path: Any, fake: Any) -> Any:
    fake.context_window = WINDOW  # the model's window, as the API holds it
    return make_settings(database_url, tmp_path, fake.base_url)


def _kinds(requests: list[dict[str, Any]]) -> list[str]:
    out = []
    for body in requests:
        text = json.dumps(body, ensure_ascii=False)
        out.append("flush" if FLUSH in text else "checkpoint" if MARKER in text else "turn")
    return out


async def test_the_spend_is_every_call_the_api_answered_checkpoints_and_flushes_included(
        client, fake_anthropic, database_url, tmp_path):
    settings = _settings(database_url, tmp_path, fake_anthropic)
    fake_anthropic.responder = CheckpointModel(good_checkpoint)
    cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"spend-{uuid.uuid4().hex[:8]}", config=cfg,
                                           agent=AgentSpec(budget=BudgetSpec(
                                               session=BudgetLimits(usd=100.0))))
        for n in range(5):
            outcome = await session.ask(f"Part {n}: {BLOCK}")
            assert outcome.error is None, outcome.error
        last_turn = await session.status()
        await session.checkpoint_now()  # between turns: the session's spend, no turn's
        status = await session.status()
    assert status.checkpoint_count > last_turn.checkpoint_count
    assert status.spent.input_tokens > last_turn.spent.input_tokens
    assert status.turn_spent == last_turn.turn_spent
    kinds = _kinds(fake_anthropic.requests)
    assert status.checkpoint_count >= 2 and "checkpoint" in kinds and "flush" in kinds
    usages = fake_anthropic.usages
    assert len(usages) == len(kinds)  # every request was answered
    spent = status.spent
    assert spent.input_tokens == sum(u.input + u.cache_creation for u in usages)
    assert spent.cached_tokens == sum(u.cache_read for u in usages)
    assert spent.output_tokens == sum(u.output for u in usages)
    usd = sum(u.input * PRICE["input"] + u.output * PRICE["output"]
              + u.cache_read * PRICE["read"] + u.cache_creation * PRICE["write"]
              for u in usages) / 1e6
    assert abs(spent.usd - usd) < 1e-6, (spent.usd, usd)


async def _paused_or_answered(session: SessionHandle, ask: asyncio.Task[TurnOutcome]
                              ) -> SessionStatus | None:
    for _ in range(600):
        if ask.done():
            return None
        status = await session.status()
        if status.budget_request is not None:
            return status
        await asyncio.sleep(0.05)
    raise AssertionError("the turn neither paused nor answered")


async def test_a_budget_a_checkpoint_reached_pauses_the_turn_before_its_call(
        client, fake_anthropic, database_url, tmp_path):
    """A turn's budget of 1,000 input tokens: a turn of one call always passes its gate
    (nothing spent yet); a turn that must checkpoint first spends past it on the checkpoint
    and pauses before its own call is sent, which a raise then lets go."""
    settings = _settings(database_url, tmp_path, fake_anthropic)
    fake_anthropic.responder = CheckpointModel(good_checkpoint)
    cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT)
    agent = AgentSpec(budget=BudgetSpec(turn=BudgetLimits(input_tokens=1_000)))
    paused_turns = 0
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"gate-{uuid.uuid4().hex[:8]}", config=cfg,
                                           agent=agent)
        for n in range(5):
            part = f"Part {n}: "
            before = (await session.status()).checkpoint_count
            ask = asyncio.create_task(session.ask(part + BLOCK))
            status = await _paused_or_answered(session, ask)
            if status is not None:
                paused_turns += 1
                assert status.checkpoint_count > before  # the checkpoint came first
                assert status.budget_request is not None
                assert status.budget_request.scope == "turn"
                assert status.turn_spent.input_tokens >= 1_000
                sent = [b for b, kind in zip(fake_anthropic.requests,
                                             _kinds(fake_anthropic.requests), strict=True)
                        if kind == "turn" and part in json.dumps(b)]
                assert not sent  # the call it made room for waits on the person
                await session.raise_budget(input_tokens=100_000)
            outcome = await ask
            assert outcome.error is None and outcome.reply_text == "noted"
    assert paused_turns >= 2
