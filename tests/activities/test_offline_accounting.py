"""The offline model counts and refuses as the Messages API does (activities.offline)."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError

from activities.offline.accounting import TOOL_PROMPT_TOKENS, Accounting
from activities.offline.backend import OfflineBackend
from schemas.config import ModelSettings
from schemas.model import PROMPT_TOO_LONG

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
