"""PostgreSQL access: one async pool per process, migrations applied in order on start.

Invariant: a connection an activity waits for never outlasts its attempt. `connection`
waits on the pool no longer than the attempt has left (less a margin to say why); when
none comes it raises `DATABASE_UNAVAILABLE` naming PostgreSQL's own reason (one direct
connection tried: refused, no such socket, a password), or that no pooled connection came
free. So a step that gives up says what the operator must mend, not "StartToClose timeout".
The pool gives up on a lost connection within `RECONNECT_S`, so the next step after an
outage starts a fresh try at once; and a pooled connection idle for more than
`IDLE_CHECK_S` is tried before anyone gets it, so the first step after PostgreSQL restarted
or failed over gets a live one instead of failing on its first statement.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from temporalio import activity
from temporalio.exceptions import ApplicationError

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "infra" / "migrations"
# One lock id for every Keel process, so concurrent workers migrate one at a time.
_MIGRATION_LOCK = 7_246_001

_pools: dict[str, AsyncConnectionPool] = {}
_pool_lock = asyncio.Lock()
_closers: list[Callable[[], Awaitable[None]]] = []


def migration_files() -> list[Path]:
    return sorted(MIGRATIONS_DIR.glob("*.sql"))


log = logging.getLogger("keel.worker")
# Between tries while PostgreSQL does not answer: doubling from the first, then capped.
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 5.0


def database_url_problem(database_url: str) -> str | None:
    """What makes `database_url` no connection string, found without a server: libpq says
    a bad port only as it connects, which waiting would try again for minutes."""
    try:
        info = conninfo_to_dict(database_url)
    except psycopg.ProgrammingError as err:
        return str(err)
    for port in str(info.get("port") or "").split(","):
        if port and not (port.isdecimal() and 0 < int(port) < 65_536):
            return f"port {port[:20]!r} is no port number (1 to 65535)"
    return None


def wait_for_database(database_url: str, wait_s: float) -> None:
    """Return once PostgreSQL at `database_url` takes a connection, trying again for up to
    `wait_s` seconds (a server starting beside a worker); then its last error. A string
    that is no connection string is `psycopg.ProgrammingError` at once."""
    if problem := database_url_problem(database_url):
        raise psycopg.ProgrammingError(f"DATABASE_URL: {problem}")
    deadline, pause = time.monotonic() + wait_s, RETRY_FIRST_S
    while True:
        try:
            psycopg.connect(database_url, connect_timeout=5).close()
            return
        except psycopg.OperationalError as err:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            log.warning("PostgreSQL (DATABASE_URL) does not answer (%s); trying again for "
                        "%.0f s more", first[:200], left)
            time.sleep(min(pause, left))
            pause = min(pause * 2, RETRY_MAX_S)


def apply_migrations(database_url: str) -> list[str]:
    """Apply every migration not yet applied; returns the names applied now."""
    applied_now: list[str] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r[0] for r in conn.execute("SELECT name FROM schema_migrations")}
            for path in migration_files():
                if path.name in done:
                    continue
                with conn.transaction():
                    conn.execute(path.read_text())
                    conn.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (path.name,))
                applied_now.append(path.name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
    return applied_now


# How long a caller outside an activity (the CLI, the UI) waits for a pooled connection.
POOL_WAIT_S = 30.0
# What an activity keeps of its attempt to find out and say why no connection came.
REASON_MARGIN_S = 4.0
# The one direct connection that finds PostgreSQL's reason waits at most this.
PROBE_TIMEOUT_S = 3
# How long the pool keeps trying one lost connection again (its pauses double from 1 s)
# before it gives up; the next caller then starts a fresh try at once. The library's 5
# minutes let the pauses grow past a minute, so a pool came back that long after
# PostgreSQL did.
RECONNECT_S = 5.0
DATABASE_UNAVAILABLE = "DatabaseUnavailable"
# A pooled connection given back longer ago than this is tried (an empty statement, one
# round trip) before a caller gets it: PostgreSQL may have restarted, failed over or ended
# it meanwhile, and the step that took it failed on its first statement ("terminating
# connection ..."): an attempt lost and retried, its traceback in the worker's log, a
# model call's record step handing its messages to the ordinary record. One in steady use
# is not tried.
IDLE_CHECK_S = 2.0


class _Pool(AsyncConnectionPool):
    """The process's pool, which tries a connection idle past `IDLE_CHECK_S` (or never
    given back) before handing it out: a broken one is refused (the library drops it and
    takes another once its pause of about a second has passed) and every other idle one
    is tried at once in the background, so the next take does not meet a broken one too."""

    def __init__(self, conninfo: str, **kwargs: Any) -> None:
        self.returned: WeakKeyDictionary[AsyncConnection, float] = WeakKeyDictionary()
        self._sweeps: set[asyncio.Task[None]] = set()
        super().__init__(conninfo, check=self._idle_check, **kwargs)

    async def putconn(self, conn: AsyncConnection) -> None:
        self.returned[conn] = time.monotonic()
        await super().putconn(conn)

    async def _idle_check(self, conn: AsyncConnection) -> None:
        if time.monotonic() - self.returned.get(conn, float("-inf")) <= IDLE_CHECK_S:
            return
        try:
            await conn.execute("")
        except psycopg.OperationalError:
            sweep = asyncio.ensure_future(self.check())
            self._sweeps.add(sweep)
            sweep.add_done_callback(self._sweeps.discard)
            raise


async def get_pool(database_url: str, timeout: float = POOL_WAIT_S) -> AsyncConnectionPool:
    """The process-wide pool for `database_url`, opened on first use; `PoolTimeout` when it
    has no connection by `timeout` from the call (the wait behind another caller opening it
    is at most that caller's), and the next call tries again."""
    if (pool := _pools.get(database_url)) is not None:
        return pool
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with _pool_lock:
        pool = _pools.get(database_url)
        if pool is None:
            pool = _Pool(database_url, min_size=1, max_size=10, open=False,
                         kwargs={"autocommit": True}, reconnect_timeout=RECONNECT_S)
            try:
                await pool.open(wait=True, timeout=max(0.1, deadline - loop.time()))
            except BaseException:  # a timeout closes it; a cancel must too
                await pool.close()
                raise
            _pools[database_url] = pool
        return pool


# When the activity attempt running in this task started, by this worker's own clock (the
# workers' interceptor sets it: workers.observability). The server's `started_time` gives
# the time spent only on a worker whose clock agrees with the server's: one minutes ahead
# would cut every wait to its floor, one behind would never cut it.
ATTEMPT_STARTED: ContextVar[float | None] = ContextVar("keel_attempt_started", default=None)


def wait_left() -> float:
    """How long a connection may be waited for here: in an activity, what its attempt has
    left less `REASON_MARGIN_S` (at least a second); elsewhere `POOL_WAIT_S`."""
    if not activity.in_activity():
        return POOL_WAIT_S
    info = activity.info()
    if info.start_to_close_timeout is None:
        return POOL_WAIT_S
    started = ATTEMPT_STARTED.get()
    spent = (time.monotonic() - started if started is not None
             else (datetime.now(UTC) - info.started_time).total_seconds())
    left = info.start_to_close_timeout.total_seconds() - spent - REASON_MARGIN_S
    return max(1.0, min(POOL_WAIT_S, left))


async def unavailable_reason(database_url: str) -> str:
    """Why no pooled connection came: PostgreSQL's own words from one direct connection,
    or, when that connection is taken, that the pool's connections are all in use."""
    try:
        conn = await psycopg.AsyncConnection.connect(database_url,
                                                     connect_timeout=PROBE_TIMEOUT_S)
    except psycopg.Error as err:
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        return f"PostgreSQL does not answer: {' '.join(lines)[:300] or type(err).__name__}"
    await conn.close()
    return ("PostgreSQL answers, but no connection of this worker's pool came free in time "
            "(all in use, or being opened again after an outage)")


@asynccontextmanager
async def connection(database_url: str, wait_s: float | None = None,
                     ) -> AsyncIterator[AsyncConnection]:
    """A connection from the process's pool, given back when the block ends; waited for no
    longer than `wait_s` (default `wait_left`), then `DATABASE_UNAVAILABLE` (retryable)
    with the reason."""
    async with AsyncExitStack() as stack:
        try:
            wait = wait_left() if wait_s is None else wait_s
            pool = await get_pool(database_url, timeout=wait)
            conn = await stack.enter_async_context(pool.connection(timeout=wait))
        except PoolTimeout:  # the pool's own words ("couldn't get a connection") say less
            raise ApplicationError(await unavailable_reason(database_url),
                                   type=DATABASE_UNAVAILABLE) from None
        yield conn


class Outage:
    """What a listener that reconnects every second says while PostgreSQL is away: one
    warning when it loses it, one line when it has it again, not a warning a second."""

    def __init__(self, what: str, logger: logging.Logger) -> None:
        self.what, self.log = what, logger
        self.since: float | None = None

    def lost(self, err: BaseException, retry_s: float) -> None:
        first = " ".join(str(err).split())[:300] or type(err).__name__
        if self.since is None:
            self.since = time.monotonic()
            self.log.warning("%s lost PostgreSQL (%s); trying again every %.0f s", self.what,
                             first, retry_s)
        else:
            self.log.debug("%s still without PostgreSQL: %s", self.what, first)

    def back(self) -> None:
        if self.since is not None:
            self.log.warning("%s has PostgreSQL again, after %.0f s", self.what,
                             time.monotonic() - self.since)
            self.since = None


def on_close(closer: Callable[[], Awaitable[None]]) -> None:
    """Run `closer` whenever the pools are closed (a listener of its own, say)."""
    _closers.append(closer)


async def close_pools() -> None:
    for closer in _closers:
        await closer()
    async with _pool_lock:
        for pool in _pools.values():
            await pool.close()
        _pools.clear()
