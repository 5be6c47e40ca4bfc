"""The offline model counts, caches and refuses as the Messages API does (activities.offline)."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.offline.accounting import TOOL_PROMPT_TOKENS, Accounting
from activities.offline.backend import OfflineBackend
from schemas.config import ModelSettings
from schemas.model import PROMPT_TOO_LONG
from tests.fake_anthropic import ManualClock

TOOL = {"name": "read_file", "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}


def _request(words: int) -> dict:
    return {"model": "m", "max_tokens": 50, "system": "s", "tools": [TOOL],
            "messages": [{"role": "user", "content": "word " * words}]}


async def test_usage_is_the_apis_count_tools_and_skew_included() -> None:
    request = _request(500)
    for skew in (0.8, 1.0, 1.25):
        reply = await OfflineBackend().create(ModelSettings(offline_token_skew=skew), request)
        assert reply.usage.input_tokens == Accounting(skew=skew).request(request)
        assert reply.usage.input_tokens > TOOL_PROMPT_TOKENS + 500 * skew * 0.9
        assert reply.usage.output_tokens >= 1


async def test_a_prompt_past_the_window_is_refused_with_the_apis_words() -> None:
    request = _request(2_000)
    counted = Accounting().request(request)
    with pytest.raises(ApplicationError) as err:
        await OfflineBackend().create(ModelSettings(context_window=1_000), request)
    assert err.value.type == PROMPT_TOO_LONG and err.value.non_retryable
    assert f"prompt is too long: {counted} tokens > 1000 maximum" in str(err.value)
    assert list(err.value.details) == [counted, 1_000]
    # Under the window but with no room for the reply asked for: refused as the API does.
    with pytest.raises(ApplicationError) as err:
        await OfflineBackend().create(ModelSettings(context_window=counted + 10), request)
    assert err.value.type == PROMPT_TOO_LONG and list(err.value.details) == [counted, counted - 40]


def _cached(words: int, turns: int, ttl: str = "5m") -> dict:
    """A session's request after `turns` exchanges, a breakpoint on its last block (and on
    the system prompt), as Keel marks them."""
    mark = {"type": "ephemeral", "ttl": ttl}
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        messages += [{"role": "user", "content": f"question {i}: " + "word " * words},
                     {"role": "assistant", "content": f"answer {i}"}]
    messages.append({"role": "user", "content": [
        {"type": "text", "text": "go on", "cache_control": mark}]})
    return {"model": "claude-sonnet-5", "max_tokens": 50, "tools": [TOOL],
            "system": [{"type": "text", "text": "You are Keel. " * 200, "cache_control": mark}],
            "messages": messages}


async def test_a_session_s_next_call_reads_what_its_last_wrote() -> None:
    """The usage splits the API's count into cache reads, writes and uncached input: the
    first call writes its prefix, the next reads it and writes what it adds; an entry five
    minutes idle is gone, as the API's is; the three always sum to the count."""
    clock = ManualClock()
    backend, settings = OfflineBackend(clock), ModelSettings()
    first, second = _cached(300, 1), _cached(300, 2)
    one = (await backend.create(settings, first)).usage
    assert one.cache_read_input_tokens == 0 and one.input_tokens < 10
    assert one.cache_creation_input_tokens == Accounting().request(first) - one.input_tokens
    clock.advance(60)
    two = (await backend.create(settings, second)).usage
    total = Accounting().request(second)
    read, written = two.cache_read_input_tokens or 0, two.cache_creation_input_tokens or 0
    assert read > 0.4 * total  # the system prompt and turn 1
    assert written > 300 and two.input_tokens < 10
    assert read + written + two.input_tokens == total
    clock.advance(301)  # five minutes since the last read: both entries expired
    again = (await backend.create(settings, second)).usage
    assert again.cache_read_input_tokens == 0
    assert again.cache_creation_input_tokens == total - again.input_tokens


async def test_a_prefix_under_the_model_s_minimum_and_a_refused_prompt_cache_nothing() -> None:
    backend = OfflineBackend(ManualClock())
    small = {**_cached(1, 0), "system": [{"type": "text", "text": "short",
                                          "cache_control": {"type": "ephemeral"}}]}
    for _ in range(2):  # under sonnet's 1,024 tokens: never written, never read
        usage = (await backend.create(ModelSettings(), small)).usage
        assert usage.cache_read_input_tokens == usage.cache_creation_input_tokens == 0
    big = _cached(2_000, 1)
    with pytest.raises(ApplicationError):
        await backend.create(ModelSettings(context_window=1_000), big)
    assert (await backend.create(ModelSettings(), big)).usage.cache_read_input_tokens == 0
