"""PostgreSQL access: one async pool per process, migrations applied in order on start."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psycopg
from psycopg_pool import AsyncConnectionPool

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


def wait_for_database(database_url: str, wait_s: float) -> None:
    """Return once PostgreSQL at `database_url` takes a connection, trying again for up to
    `wait_s` seconds (a server starting beside a worker); then its last error."""
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


async def get_pool(database_url: str) -> AsyncConnectionPool:
    """The process-wide pool for `database_url`, opened on first use."""
    async with _pool_lock:
        pool = _pools.get(database_url)
        if pool is None:
            pool = AsyncConnectionPool(
                database_url, min_size=1, max_size=10, open=False, kwargs={"autocommit": True}
            )
            await pool.open(wait=True, timeout=30)
            _pools[database_url] = pool
        return pool


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
