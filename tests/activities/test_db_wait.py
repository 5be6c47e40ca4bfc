"""A step that gets no connection says why, inside its attempt (activities.db.connection):
PostgreSQL's own reason when it refuses, "in use" when the worker's pool is busy, never the
attempt's "StartToClose timeout". Real PostgreSQL; the activity's attempt from Temporal's
ActivityEnvironment."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.db import (
    ATTEMPT_STARTED,
    DATABASE_UNAVAILABLE,
    IDLE_CHECK_S,
    REASON_MARGIN_S,
    Outage,
    connection,
    get_pool,
    wait_for_database,
    wait_left,
)
from tests.harness import database_closed

ATTEMPT_S = 6.0  # the waits below are this less REASON_MARGIN_S: two seconds


def _attempt_env() -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, start_to_close_timeout=timedelta(seconds=ATTEMPT_S),
                                   started_time=datetime.now(UTC))
    return env


@activity.defn
async def select_one(database_url: str) -> int:
    async with connection(database_url) as conn:
        row = await (await conn.execute("SELECT 1")).fetchone()
        assert row is not None
        return int(row[0])


async def _refused(database_url: str) -> tuple[ApplicationError, float]:
    started = time.monotonic()
    with pytest.raises(ApplicationError) as caught:
        await _attempt_env().run(select_one, database_url)
    return caught.value, time.monotonic() - started


@pytest.fixture
async def closed_database(database_url: str, pg_admin_url: str) -> AsyncIterator[str]:
    """The test's database with its pool open, then closed to connections and its
    sessions ended: the pool's connections break and none comes back (an outage as the
    pool sees it). The step that meets the pool's broken connection fails with the
    server's words (and the pool drops it); the next waits. Opened again after."""
    assert await _attempt_env().run(select_one, database_url) == 1
    with database_closed(pg_admin_url, database_url):
        with pytest.raises(psycopg.OperationalError, match="terminating connection"):
            await _attempt_env().run(select_one, database_url)
        yield database_url


async def test_an_outage_is_named_by_postgresql_within_the_attempt(closed_database):
    err, took = await _refused(closed_database)
    assert err.type == DATABASE_UNAVAILABLE and not err.non_retryable
    assert "PostgreSQL does not answer" in err.message
    assert "is not currently accepting connections" in err.message  # the server's words
    assert took < ATTEMPT_S - 1  # the attempt's own timeout never came


async def test_a_server_that_is_not_there_is_named_when_the_pool_first_opens(tmp_path):
    url = f"postgresql://postgres:@/postgres?host={tmp_path}"  # no server on this socket
    err, took = await _refused(url)
    assert err.type == DATABASE_UNAVAILABLE
    assert "No such file or directory" in err.message and str(tmp_path) in err.message
    assert took < ATTEMPT_S - 1


async def test_a_busy_pool_is_said_to_be_busy_not_down(database_url):
    pool = await get_pool(database_url)
    async with AsyncExitStack() as held:  # every connection the pool may open, taken
        for _ in range(pool.max_size):
            await held.enter_async_context(pool.connection())
        err, took = await _refused(database_url)
    assert err.type == DATABASE_UNAVAILABLE
    assert "no connection of this worker's pool came free in time" in err.message
    assert ATTEMPT_S - REASON_MARGIN_S - 0.5 < took < ATTEMPT_S - 1
    assert await _attempt_env().run(select_one, database_url) == 1  # given back: served


async def test_the_first_step_after_postgresql_ended_the_pool_s_connections_gets_a_live_one(
        database_url, pg_admin_url):
    """PostgreSQL restarted, failed over or ended its sessions while the pool's connections
    sat idle: the next step gets a live connection and answers. Before, it failed on its
    first statement ("terminating connection due to administrator command") and was
    retried."""
    async with AsyncExitStack() as held:  # three connections in the pool, all idle after
        pool = await get_pool(database_url)
        for _ in range(3):
            await held.enter_async_context(pool.connection())
    name = conninfo_to_dict(database_url)["dbname"]
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        ended = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                              " WHERE datname = %s", (name,)).fetchone()
    assert ended is not None and ended[0] >= 3
    await asyncio.sleep(IDLE_CHECK_S + 0.2)
    for _ in range(3):  # every step, not only the first
        started = time.monotonic()
        assert await _attempt_env().run(select_one, database_url) == 1
        assert time.monotonic() - started < ATTEMPT_S - REASON_MARGIN_S


@activity.defn
async def wait_here() -> float:
    return wait_left()


async def test_the_wait_counts_the_attempt_by_the_worker_s_clock_not_the_server_s():
    """The server's clock ten minutes behind this worker's (its `started_time` of the
    attempt reads ten minutes ago): with the worker's own start, the wait is the attempt's
    time less the margin, where before it was cut to its one-second floor."""
    env = _attempt_env()
    env.info = dataclasses.replace(env.info, started_time=datetime.now(UTC)
                                   - timedelta(minutes=10))
    assert await env.run(wait_here) == 1.0  # no worker's start: the server's clock rules
    token = ATTEMPT_STARTED.set(time.monotonic())
    try:
        assert ATTEMPT_S - REASON_MARGIN_S - 0.5 < await env.run(wait_here) \
            <= ATTEMPT_S - REASON_MARGIN_S
    finally:
        ATTEMPT_STARTED.reset(token)


async def test_outside_an_activity_the_wait_is_the_pool_s_own(database_url):
    async with connection(database_url) as conn:  # the CLI's and the UI's callers
        assert await (await conn.execute("SELECT 2")).fetchone() == (2,)


OUTAGE_S = 20.0  # long enough for the library's pauses between tries to pass 10 s


async def test_the_pool_is_back_as_soon_as_postgresql_is(database_url, pg_admin_url):
    """An outage of OUTAGE_S during which a step waited: the first step after it gets a
    connection at once. Before, the pool's pauses between tries had doubled to 16 s by
    then, and the step waited out its whole attempt."""
    assert await _attempt_env().run(select_one, database_url) == 1
    with database_closed(pg_admin_url, database_url):
        with pytest.raises(psycopg.OperationalError):  # the pool learns of it: it tries again
            await _attempt_env().run(select_one, database_url)
        await _refused(database_url)  # a step waits: the pool grows, its tries back off
        await asyncio.sleep(OUTAGE_S)
    started = time.monotonic()
    assert await _attempt_env().run(select_one, database_url) == 1
    assert time.monotonic() - started < 2.0


def test_a_listener_says_once_that_postgresql_is_away_and_once_that_it_is_back(caplog):
    outage = Outage("the interrupt listener", logging.getLogger("keel.test"))
    with caplog.at_level(logging.WARNING, logger="keel.test"):
        for _ in range(30):  # thirty seconds of tries
            outage.lost(psycopg.OperationalError("connection refused"), 1.0)
        outage.back()
        outage.back()  # connected, nothing lost since
    assert [r.getMessage() for r in caplog.records] == [
        "the interrupt listener lost PostgreSQL (connection refused); trying again every 1 s",
        "the interrupt listener has PostgreSQL again, after 0 s"]


@pytest.mark.parametrize(("url", "says"), [
    ("postgresql://k@127.0.0.1:99999/db", "port '99999' is no port number"),
    ("postgresql://k@h1:5432,h2:abc/db", "port 'abc' is no port number"),
    ("host=a port=0", "port '0' is no port number"),
    ("notaurl", 'missing "=" after "notaurl"'),
])
def test_a_string_that_is_no_connection_string_is_refused_at_once(url: str, says: str) -> None:
    # libpq says a bad port only as it connects: a worker waited two minutes on it.
    started = time.monotonic()
    with pytest.raises(psycopg.ProgrammingError, match=f"DATABASE_URL: {says}"):
        wait_for_database(url, 60)
    assert time.monotonic() - started < 5
