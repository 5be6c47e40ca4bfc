"""The worker's warm MCP sessions (activities/mcp_pool.py) through the MCP activities, against
real servers (tests/mcp/servers/pool_server.py over stdio, the docs server over HTTP), in
temporalio's ActivityEnvironment: warm reuse per Keel session, what may be shared, a
listing cached until the server says it changed, a crashed or hung server replaced at the
cost of the one call that found it, the cap, the idle bound, and no process left after
the pool closes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.mcp import (
    CallMcpToolInput,
    ListMcpToolsInput,
    McpActivities,
    McpCallResult,
    McpFailure,
)
from activities.mcp_pool import McpPool
from schemas.mcp import McpServerSpec
from tests.mcp.conftest import POOL, http_spec, server_pids, stdio_spec


@pytest.fixture
async def pool() -> AsyncIterator[McpPool]:
    made = McpPool()
    yield made
    await made.close()
    assert server_pids(POOL) == []


def pool_spec(**fields: Any) -> McpServerSpec:  # stdio_spec's keywords, passed on
    return stdio_spec(POOL, name="pool", **fields)


async def call(pool: McpPool, spec: McpServerSpec, tool: str, session: str = "s1",
               env: ActivityEnvironment | None = None, **arguments: object) -> McpCallResult:
    return await (env or ActivityEnvironment()).run(
        McpActivities(pool).call_mcp_tool,
        CallMcpToolInput(server=spec, tool=tool, arguments=arguments, session_id=session))


async def pid(pool: McpPool, spec: McpServerSpec, session: str = "s1") -> int:
    result = await call(pool, spec, "whoami", session)
    assert not result.is_error, result.text
    return int(result.text)


async def names(pool: McpPool, spec: McpServerSpec, session: str = "s1",
                refresh: bool = False) -> set[str]:
    listed = await ActivityEnvironment().run(
        McpActivities(pool).list_mcp_tools,
        ListMcpToolsInput(server=spec, session_id=session, refresh=refresh))
    return {tool.original_name for tool in listed.tools}


async def until(condition: Callable[[], bool], within_s: float = 10) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_a_session_reuses_its_process_and_keeps_its_state_to_itself(pool):
    spec = pool_spec()
    assert "whoami" in await names(pool, spec)  # the listing starts the process...
    first = await pid(pool, spec)
    assert await pid(pool, spec) == first  # ...and every later call reuses it
    timed = json.loads((await call(pool, spec, "timed")).text)
    assert timed["pid"] == first
    assert (await call(pool, spec, "remember", text="s1's note")).text == "kept 1"
    # Another Keel session never gets that process, nor what it was told.
    assert await pid(pool, spec, "s2") != first
    assert (await call(pool, spec, "recall", "s2")).text == "nothing"
    assert (await call(pool, spec, "recall")).text == "s1's note"
    assert len(server_pids(POOL)) == 2


async def test_a_shared_server_serves_every_session_but_not_other_secrets(pool,
                                                                          monkeypatch):
    spec = pool_spec(sharing="shared", env_names=("KEEL_TEST_POOL_TOKEN",))
    monkeypatch.setenv("KEEL_TEST_POOL_TOKEN", "token-one-1234")
    one = await pid(pool, spec, "s1")
    assert await pid(pool, spec, "s2") == one
    # The worker's value changed: a new process, never one started with the old value.
    monkeypatch.setenv("KEEL_TEST_POOL_TOKEN", "token-two-5678")
    assert await pid(pool, spec, "s1") != one


async def test_no_session_id_or_no_keeping_means_a_process_per_call(pool):
    # Nothing kept: the call's process is gone when the activity returns.
    for spec, session in ((pool_spec(), ""), (pool_spec(keep_warm_s=0), "s1")):
        await pid(pool, spec, session)
        assert pool.sessions() == [] and server_pids(POOL) == []


async def test_listing_cached_until_the_server_says_it_changed(pool):
    spec = pool_spec()
    assert "quiet" not in await names(pool, spec)
    await call(pool, spec, "add_tool", name="quiet", announce=False)
    assert "quiet" not in await names(pool, spec)  # served from the cache
    (session,) = pool.sessions()
    await call(pool, spec, "add_tool", name="loud")
    await until(lambda: session.list_changes > 0)  # the server said its list changed
    assert {"quiet", "loud"} <= await names(pool, spec)
    # A refresh lists on a new session: a new process, offering only its own tools.
    before = await pid(pool, spec)
    assert not {"quiet", "loud"} & await names(pool, spec, refresh=True)
    assert await pid(pool, spec) != before


async def test_a_crashed_or_hung_server_costs_only_the_call_that_found_it(pool):
    spec = pool_spec(call_s=1)
    dead = await pid(pool, spec)
    os.kill(dead, signal.SIGKILL)  # dies while idle
    await until(lambda: not pool.sessions()[0].alive)
    second = await pid(pool, spec)  # replaced before any request: no call failed
    assert second != dead
    crashed = await call(pool, spec, "crash")
    assert crashed.is_error and crashed.failure == McpFailure.CRASHED
    third = await pid(pool, spec)
    assert third != second
    hung = await call(pool, spec, "hang")
    assert hung.is_error and hung.failure == McpFailure.TIMEOUT
    assert third not in server_pids(POOL)  # the hung process was stopped
    assert await pid(pool, spec) not in (dead, second, third)
    assert len(server_pids(POOL)) == 1


async def test_cap_per_declaration_waits_evicts_and_gives_up_in_time(pool):
    capped = pool_spec(max_warm=1)
    first = await pid(pool, capped, "s1")
    await pid(pool, capped, "s2")  # the cap: s1's idle process made room
    await until(lambda: first not in server_pids(POOL))
    assert len(pool.sessions()) == 1
    # Shared, one session: the second of two callers waits (within connect_s) for it.
    shared = pool_spec(max_warm=1, sharing="shared", connect_s=10)
    both = await asyncio.gather(call(pool, shared, "timed", ms=300),
                                call(pool, shared, "timed", "s2", ms=300))
    assert len({json.loads(r.text)["pid"] for r in both}) == 1
    # A caller that may wait only 0.5 s while it stays busy gives up, and says why.
    slow = asyncio.create_task(call(pool, shared, "timed", ms=1500))
    await until(lambda: any(s.busy for s in pool.sessions()))
    busy = await call(pool, shared.model_copy(update={"connect_s": 0.5}), "whoami", "s2")
    assert busy.is_error and busy.failure == McpFailure.TIMEOUT
    assert "all 1 of its sessions on this worker are busy" in busy.text
    # A refresh meanwhile lists on a new session; the call in flight is not cut off.
    assert "whoami" in await names(pool, shared, "s2", refresh=True)
    assert not (await slow).is_error


async def test_an_idle_session_closes_after_its_time(pool):
    spec = pool_spec(keep_warm_s=0.3)
    alive = await pid(pool, spec)
    await until(lambda: not pool.sessions())
    await until(lambda: alive not in server_pids(POOL))


async def test_closing_the_pool_leaves_no_process(pool):
    spec = pool_spec()
    started = [await pid(pool, spec, f"s{n}") for n in range(2)]
    assert sorted(server_pids(POOL)) == sorted(started)
    await pool.close()
    assert server_pids(POOL) == [] and pool.sessions() == []
    after = await call(pool, spec, "whoami")
    assert after.is_error and "shutting down" in after.text
    with pytest.raises(ApplicationError, match="shutting down"):
        await names(pool, spec)


async def test_a_cancelled_call_stops_its_server(pool):
    spec = pool_spec(call_s=30)
    await pid(pool, spec)
    env = ActivityEnvironment()
    task = asyncio.create_task(call(pool, spec, "hang", env=env))
    await until(lambda: any(s.busy for s in pool.sessions()))
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 15)
    assert server_pids(POOL) == [] and pool.sessions() == []


async def test_an_http_session_is_reused(pool, docs_http_url, key_env):
    spec = http_spec(docs_http_url, {"X-Docs-Key": "KEEL_TEST_DOCS_KEY"})
    assert "search_docs" in await names(pool, spec)
    (session,) = pool.sessions()
    for query in ("refund", "support hours"):
        result = await call(pool, spec, "search_docs", query=query)
        assert not result.is_error and result.text
    assert pool.sessions() == [session] and session.reused
    missing = await call(pool, spec, "no_such_tool")  # an ordinary MCP error: still warm
    assert missing.is_error and pool.sessions() == [session]
