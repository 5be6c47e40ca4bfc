"""A session whose calls wait more than five minutes for one another keeps its context in
the prompt cache for an hour (schemas.cache_ttl): after two ten-minute gaps between turns
its third turn reads the conversation from the cache, where a session held to five minutes
writes it all again; a wait for a person's approval inside a turn counts the same.

Time is skipped (Temporal's time-skipping server, so the session's clock sees the gaps) and
the fake API's clock moves with it (its cache entries expire as the real API's do). The
time-skipping server takes no Updates: turns are asked by Task signals."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from temporalio.testing import WorkflowEnvironment

from examples.support.service import toolset
from keel.client import KeelClient, session_config
from schemas.agent import AgentSpec, ApprovalRules
from schemas.cache_ttl import CacheTtl
from tests.fake_anthropic import (
    ErrorStep,
    FakeAnthropic,
    ManualClock,
    Responder,
    text_message,
    tool_use_message,
)
from tests.harness import keel_worker, make_settings

GAP_S = 600
# Instructions long enough that the prefix is one the API caches (its minimum length).
SPEC = AgentSpec(instructions="You watch a release and note what changes. " * 300)


def _replies(database_url: str, session_id: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM messages WHERE session_id = %s"
                           " AND type = 'assistant'", (session_id,)).fetchone()
    return int(row[0]) if row else 0


async def _turn(session: Any, database_url: str, turn: int) -> None:
    await session.task(f"t{turn}", "Release watch", f"check {turn}: what changed?")
    deadline = time.monotonic() + 60
    while _replies(database_url, session.session_id) < turn:
        assert time.monotonic() < deadline, f"turn {turn} got no reply"
        await asyncio.sleep(0.1)


def _ttls(body: dict[str, Any]) -> set[str]:
    marks = [b.get("cache_control") for b in body["system"]] + [
        b.get("cache_control") for m in body["messages"] if isinstance(m["content"], list)
        for b in m["content"]]
    return {str(c.get("ttl", "5m")) for c in marks if c}


@dataclass
class _Stack:
    keel: KeelClient
    fake: FakeAnthropic
    wait: Callable[[], Awaitable[None]]  # ten minutes on both clocks


@asynccontextmanager
async def _stack(env: WorkflowEnvironment, database_url: str, tmp_path: Path,
                 responder: Responder) -> AsyncIterator[_Stack]:
    """A worker on the time-skipping server and the fake API, whose clock a wait moves
    first (a call the wait releases finds the API's five minutes gone), then Temporal's."""
    clock = ManualClock(1_000.0)
    fake = FakeAnthropic(responder, clock=clock).start()

    async def wait() -> None:
        clock.advance(GAP_S)
        await env.sleep(GAP_S)
    try:
        settings = make_settings(database_url, tmp_path, fake.base_url)
        async with keel_worker(env.client, settings) as keel:
            yield _Stack(keel, fake, wait)
    finally:
        fake.stop()


async def test_a_session_with_long_gaps_reads_its_context_from_the_cache_after_them(
        time_skipping_env, database_url, tmp_path) -> None:
    async with _stack(time_skipping_env, database_url, tmp_path,
                      lambda body: text_message("noted")) as stack:
        fake, seen = stack.fake, {}
        for mode in (CacheTtl.AUTO, CacheTtl.SHORT):
            fake.cache.clear()
            session = await stack.keel.start_session(
                f"ttl-{mode.name.lower()}", agent=SPEC,
                config=session_config(stack.keel.settings, prompt_cache_ttl=mode))
            first = len(fake.requests)
            for turn in (1, 2, 3):
                if turn > 1:  # the session and the API both see ten minutes go by
                    await stack.wait()
                await _turn(session, database_url, turn)
            seen[mode] = list(zip([_ttls(b) for b in fake.requests[first:]],
                                  fake.usages[first:], strict=True))
            status = await session.status()  # what `keel status` shows
            assert (status.prompt_cache_ttl, status.prompt_cache_setting) == (
                CacheTtl.LONG if mode is CacheTtl.AUTO else CacheTtl.SHORT, mode)
    auto, short = seen[CacheTtl.AUTO], seen[CacheTtl.SHORT]
    assert [ttls for ttls, _ in auto] == [{"5m"}, {"1h"}, {"1h"}]  # no gap seen before turn 2
    assert [ttls for ttls, _ in short] == [{"5m"}] * 3
    # Turn 2 follows the first gap either way: everything written again.
    assert auto[1][1].cache_read == short[1][1].cache_read == 0
    # Turn 3: written for an hour by turn 2, the context is read back; kept five minutes,
    # it expired and is written again, whole.
    read, written = auto[2][1].cache_read, short[2][1].cache_creation
    assert read >= 0.9 * written and short[2][1].cache_read == 0
    assert auto[2][1].cache_creation == auto[2][1].creation_1h < 0.05 * written  # the new


def _refund_or_answer(body: dict[str, Any]) -> dict[str, Any]:
    last = body["messages"][-1]["content"]
    if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
        return text_message("No refund, then.")
    return tool_use_message([("refund", {"order_id": "A-1001", "amount_cents": 2599})])


async def test_a_wait_for_a_persons_approval_counts_as_a_wait(
        time_skipping_env, database_url, tmp_path) -> None:
    """Each turn asks for a refund, which waits ten minutes on a person (then the policy's
    default, deny, applies). The call after the first wait learned it: from then on the
    context is kept an hour, and the call after the second wait reads it back."""
    spec = SPEC.model_copy(update={
        "tools": toolset("no-worker-needed").declarations(),
        "approvals": ApprovalRules(timeout_s=GAP_S, on_timeout="deny")})
    async with _stack(time_skipping_env, database_url, tmp_path,
                      _refund_or_answer) as stack:
        session = await stack.keel.start_session("ttl-approval", agent=spec)
        for turn in (1, 2):
            await session.task(f"t{turn}", "Refunds", f"refund A-1001, try {turn}")
            for _ in range(600):  # the refund's call, waiting on a person
                if await session.pending():
                    break
                await asyncio.sleep(0.05)
            await stack.wait()  # the policy's timeout passes: the call after it comes now
            deadline = time.monotonic() + 60
            while _replies(database_url, session.session_id) < 2 * turn:
                assert time.monotonic() < deadline, f"turn {turn} got no reply"
                await asyncio.sleep(0.1)
        fake = stack.fake
    assert [_ttls(body) for body in fake.requests] == [{"5m"}, {"1h"}, {"1h"}, {"1h"}]
    after_first, after_second = fake.usages[1], fake.usages[3]
    assert after_first.cache_read == 0  # the first wait outlived the five minutes
    assert after_second.cache_read >= 0.9 * after_second.total_input


async def test_a_provider_that_takes_no_hour_is_asked_with_the_default_and_no_more(
        time_skipping_env, database_url, tmp_path) -> None:
    """A provider (a proxy, an older API) that refuses the `ttl` field: the call that asked
    for the hour is sent again at once with the default and answered; the session asks
    for the hour no more, and says so."""
    refusal = "messages.1.content.0.cache_control.ttl: Extra inputs are not permitted"

    def no_hour(body: dict[str, Any]) -> Any:
        return ErrorStep(400, "invalid_request_error", refusal) if "1h" in _ttls(body) \
            else text_message("noted")
    async with _stack(time_skipping_env, database_url, tmp_path, no_hour) as stack:
        session = await stack.keel.start_session("ttl-refused", agent=SPEC)
        for turn in (1, 2, 3):
            if turn > 1:
                await stack.wait()
            await _turn(session, database_url, turn)
        status = await session.status()
        requests = stack.fake.requests
    assert [_ttls(body) for body in requests] == [{"5m"}, {"1h"}, {"5m"}, {"5m"}]
    assert status.prompt_cache_ttl is CacheTtl.SHORT and status.last_error is None
