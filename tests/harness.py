"""Test helpers: settings for a test, a worker running in this process, and stopping a
process a test started."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Unpack

from temporalio.client import Client, WorkflowHandle

from keel.client import KeelClient, SessionHandle, SessionOverrides, session_config
from schemas.config import KeelSettings, ModelSettings
from schemas.events import StreamWatchers
from schemas.session import Handler, SessionConfig
from tests.fake_anthropic import FakeAnthropic
from workers.worker import Role, build_worker


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
