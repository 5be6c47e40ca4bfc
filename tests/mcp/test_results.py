"""An MCP result over its cap (issue 21): the worker keeps the whole text in the session's
workspace and the activity returns only the text cut to the cap, saying where the rest is;
a 64 MB result over stdio arrives whole, fast, and never crosses Temporal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment

from activities.files import kept_result_path
from activities.mcp import CallMcpToolInput, McpActivities, McpCallResult
from activities.mcp_pool import McpPool
from activities.workspace import KEPT_RESULT_MAX_BYTES, LocalStore
from tests.mcp.conftest import POOL, stdio_spec

CAP = 20_000
SPEC = stdio_spec(POOL, name="pool", call_s=60)


@pytest.fixture
async def pool() -> AsyncIterator[McpPool]:
    made = McpPool()
    yield made
    await made.close()


def store_at(tmp_path: Path, max_workspace_bytes: int = 1 << 30) -> LocalStore:
    return LocalStore(tmp_path / "workspaces", tmp_path, max_file_bytes=1_000_000,
                      max_workspace_bytes=max_workspace_bytes)


async def big(pool: McpPool, store: LocalStore, chars: int,
              call_id: str = "toolu_big") -> McpCallResult:
    acts = McpActivities(pool, store=lambda: store)
    return await ActivityEnvironment().run(acts.call_mcp_tool, CallMcpToolInput(
        server=SPEC, tool="big", arguments={"chars": chars}, session_id="s1",
        call_id=call_id, cap_chars=CAP))


async def test_a_64_mb_result_is_kept_whole_and_the_model_gets_the_cap(pool, tmp_path):
    store = store_at(tmp_path)
    chars = 64_000_000
    result = await big(pool, store, chars)
    path = kept_result_path("toolu_big")
    assert not result.is_error and result.truncated and result.whole_result == path
    assert result.text == "y" * CAP + (f"\n[result cut at {CAP} of {chars} characters; the "
                                       f"whole result is in {path}; read it with read_file]")
    kept = await store.read("s1", path)
    assert kept is not None and len(kept.data) == chars and kept.data == b"y" * chars
    # What goes back through Temporal is the cut text, far under its 2 MiB payload limit.
    (payload,) = pydantic_data_converter.payload_converter.to_payloads([result])
    assert len(payload.data) < 25_000
    # Written once per call id: the same call again writes nothing new.
    again = await big(pool, store, 10 * CAP)
    assert again.whole_result == path and (await store.read("s1", path)).version == 1
    assert chars <= KEPT_RESULT_MAX_BYTES


async def test_a_result_the_workspace_refuses_still_fits_the_cap(pool, tmp_path):
    store = store_at(tmp_path, max_workspace_bytes=100_000)
    result = await big(pool, store, 300_000)
    assert not result.is_error and result.truncated and result.whole_result is None
    assert len(result.text) <= CAP
    assert "of 300000 characters; the whole result could not be kept: the workspace " \
           "would be 300,000 bytes; the limit is 100,000 bytes" in result.text
    assert await store.read("s1", kept_result_path("toolu_big")) is None


async def test_a_result_under_the_cap_is_returned_as_is(pool, tmp_path):
    store = store_at(tmp_path)
    result = await big(pool, store, CAP)
    assert result.text == "y" * CAP and not result.truncated and result.whole_result is None
    assert await store.list("s1") == []
