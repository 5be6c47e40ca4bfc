"""Test helpers: settings for a test, a worker running in this process, and stopping a
process a test started."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar, Unpack

import psycopg
from psycopg.conninfo import conninfo_to_dict
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from keel.client import KeelClient, SessionHandle, SessionOverrides, session_config
from keel.devstack import temporal_cli_path
from schemas.config import KeelSettings, ModelSettings
from schemas.events import StreamWatchers
from schemas.session import Handler, SessionConfig
from tests.fake_anthropic import FakeAnthropic
from workers.worker import Role, build_worker

T = TypeVar("T")


async def until(probe: Callable[[], Awaitable[T | None]], within_s: float = 30,
                every_s: float = 0.1) -> T:
    """`probe()`'s first truthy answer, asked every `every_s`; AssertionError after
    `within_s` without one."""
    deadline = time.monotonic() + within_s
    while not (found := await probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{probe} found nothing within {within_s} s")
        await asyncio.sleep(every_s)
    return found


def make_settings(database_url: str | None, data_dir: Path, base_url: str | None = None,
                  **model: Any) -> KeelSettings:  # more of ModelSettings' fields
    return KeelSettings(
        database_url=database_url,
        data_dir=data_dir,
        task_queue=f"keel-test-{uuid.uuid4().hex[:8]}",
        shutdown_grace_s=0,  # a test's worker stops at once, whatever it left in flight
        model=ModelSettings(base_url=base_url, api_key="test-key" if base_url else None,
                            request_timeout_s=20, **model),
    )


@asynccontextmanager
async def keel_worker(client: Client, settings: KeelSettings,
                      role: Role = Role.BOTH) -> AsyncIterator[KeelClient]:
    worker = build_worker(client, settings, role=role)
    async with worker:
        yield KeelClient(client, settings.task_queue, settings)


@contextmanager
def database_closed(admin_url: str, database_url: str) -> Iterator[None]:
    """The database at `database_url` closed to connections and its sessions ended for
    the block (an outage as its clients see it: their connections break, none comes back),
    then open again; the shared server is never stopped."""
    name = conninfo_to_dict(database_url)["dbname"]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                      " WHERE datname = %s", (name,))
        try:
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


def small_config(settings: KeelSettings, **overrides: Unpack[SessionOverrides]) -> SessionConfig:
    return session_config(settings, **overrides)


def stop_process(proc: subprocess.Popen, grace_s: float = 5) -> None:
    """Ask `proc` to stop (SIGTERM); kill it when it has not within `grace_s` seconds."""
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace_s)


async def output_until(proc: subprocess.Popen[str], marker: str, within_s: float) -> str:
    """A process's output read line by line until `marker` shows (or it ends, or
    `within_s` passes): what it printed so far."""
    seen = ""
    deadline = time.monotonic() + within_s
    assert proc.stdout is not None
    while marker not in seen and time.monotonic() < deadline:
        line = await asyncio.to_thread(proc.stdout.readline)
        if not line:
            break
        seen += line
    return seen


async def reader_seen(handle: WorkflowHandle, timeout_s: float = 60) -> None:
    """Until the session counts a reader of its stream (`StreamWatchers.reading`, the rule
    the model call's publisher applies), so a reply written after it streams from its first
    delta (activities.events)."""
    async def loop() -> None:
        before = None
        while True:
            seen = await handle.query(Handler.STREAM_WATCHERS, result_type=StreamWatchers)
            if seen.reading(before):
                return
            before = seen.polls if before is None else before
            await asyncio.sleep(0.05)
    await asyncio.wait_for(loop(), timeout_s)


def flood(words: int) -> str:
    """Text of ~2 tokens a word that no search or summary shrinks."""
    return " ".join(f"x{i % 83}" for i in range(words))


async def start_flooded(keel: KeelClient, fake: FakeAnthropic, session_id: str,
                        config: SessionConfig) -> SessionHandle:
    """A session on a 12,000-token window whose provider (`fake`, the fake Messages API)
    holds only 6,000: its first input, a Watch within Keel's input limit, is refused by
    the API as too long, with nothing before it to move out."""
    fake.context_window = 6_000
    session = await keel.start_session(session_id, config=config)
    await session.watch("w-1", "log tail", flood(2_850))
    return session


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DevServer:
    """`temporal server start-dev` on one port and one database file (as `keel dev` runs
    it), startable again: a test's own server, to stop, kill or leave behind."""

    def __init__(self, db: Path) -> None:
        self.port, self.db = free_port(), db
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        self.proc = subprocess.Popen(
            [temporal_cli_path(), "server", "start-dev", "--headless", "--log-level", "error",
             "--port", str(self.port), "--ui-port", str(free_port()),
             "--db-filename", str(self.db)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self.proc

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    async def client(self) -> Client:
        for _ in range(300):
            try:
                return await Client.connect(f"127.0.0.1:{self.port}",
                                            data_converter=pydantic_data_converter)
            except RuntimeError:
                await asyncio.sleep(0.1)
        raise AssertionError("the Temporal dev server did not start")
