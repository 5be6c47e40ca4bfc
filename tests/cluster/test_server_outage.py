"""A Temporal server that goes away mid-turn (a crash, a restart for an upgrade) loses
nothing: the model call in flight finishes, its reply is recorded once and the turn
completes when the server is back; a message sent while it is away is refused to its
sender (never recorded behind their back); the session takes the next message as before.
A worker started before its server waits for it; the schedules it makes at start wait out
a server away.

Real parts: a Temporal dev server process of the test's own, on a fixed port with its
SQLite file (what `keel dev` runs), killed with SIGKILL and started again on that file;
PostgreSQL; Keel's worker; the real SDK talking to the fake Messages API.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from temporalio.service import RPCError

from keel.client import KeelClient
from tests.fake_anthropic import text_message
from tests.harness import DevServer, keel_worker, make_settings
from workers.schedules import keep_memory_schedules, memory_schedules

ROOT = Path(__file__).resolve().parents[2]

# Away for longer than the SDK retries one call (the send below is refused after ~6 s of
# them), and then some.
AWAY_S = 2.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[DevServer]:
    srv = DevServer(tmp_path / "temporal.sqlite")
    srv.start()
    yield srv
    srv.kill()


def _record(database_url: str, session_id: str) -> list[tuple[str, str]]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT type, content::text FROM messages WHERE session_id = %s"
                            " ORDER BY seq", (session_id,)).fetchall()
    return [(kind, text) for kind, text in rows]


async def test_a_server_outage_mid_turn_loses_nothing(server, database_url, fake_anthropic,
                                                      tmp_path) -> None:
    calling = threading.Event()  # the model call is in flight
    release = threading.Event()  # ... and answers when the test says so

    def slow_answer(body: dict) -> dict:
        calling.set()
        release.wait(60)
        return text_message(f"answer {len(body['messages'])}")
    fake_anthropic.responder = slow_answer
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    sid = f"outage-{uuid.uuid4().hex[:8]}"
    async with keel_worker(await server.client(), settings) as keel:
        session = await keel.start_session(sid)
        await session.send("first question")
        assert await asyncio.to_thread(calling.wait, 30), "the model call never came"

        server.kill()  # the call is in flight; its session's server is gone
        release.set()  # the reply comes while nobody can hear the activity finish
        with pytest.raises(RPCError):
            await session.send("sent while the server is away")
        await asyncio.sleep(AWAY_S)
        server.start()

        second = await asyncio.wait_for(session.ask("second question"), timeout=90)
        status = await session.status()
    assert second.error is None and second.reply_text == "answer 3"
    assert status.last_error is None and status.turn == 2
    record = _record(database_url, sid)
    assert [kind for kind, _ in record] == ["user", "assistant", "user", "assistant"]
    assert "sent while the server is away" not in str(record)
    assert len(fake_anthropic.requests) == 2  # the first call was not made again


async def test_a_worker_started_before_its_servers_waits_for_them(
        tmp_path, database_url, fake_anthropic) -> None:
    """A worker started while Temporal is not up yet (a compose stack coming up, a host's
    reboot) waits for it and then serves, where it failed at once."""
    fake_anthropic.responder = lambda body: text_message("served")
    srv = DevServer(tmp_path / "temporal.sqlite")  # not started yet
    queue = f"early-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TEMPORAL_ADDRESS": f"127.0.0.1:{srv.port}",
           "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": queue,
           "KEEL_DATA_DIR": str(tmp_path / "data"), "ANTHROPIC_BASE_URL":
           fake_anthropic.base_url, "ANTHROPIC_API_KEY": "test-key",
           "KEEL_CONNECT_WAIT_S": "60"}
    log = tmp_path / "worker.log"
    with log.open("a") as out:  # its own handle: reading the file never moves its writes
        worker = subprocess.Popen([sys.executable, "-m", "workers.main", "sessions"],
                                  env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        for _ in range(600):  # until it says it waits (its start takes seconds under load)
            if "does not answer" in _text(log) or worker.poll() is not None:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1)
        assert worker.poll() is None, _text(log)  # still waiting, not failed
        srv.start()
        settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
        keel = KeelClient(await srv.client(), queue, settings)
        session = await keel.start_session(f"early-{uuid.uuid4().hex[:8]}")
        reply = await asyncio.wait_for(session.ask("are you there?"), timeout=60)
        assert reply.reply_text == "served"
        worker.terminate()
        assert await asyncio.to_thread(worker.wait, 30) == 0, _text(log)
    finally:
        if worker.poll() is None:
            worker.kill()
        srv.kill()
    assert "does not answer" in _text(log)  # it said why it waited


async def test_the_memory_schedules_wait_out_a_server_away(server, tmp_path, caplog) -> None:
    """The schedules a worker makes at start are made once the server is back, not lost
    with the worker (before, the worker process ended on the first refusal)."""
    settings = make_settings(None, tmp_path)
    client = await server.client()
    server.kill()
    caplog.set_level(logging.WARNING, logger="workers.schedules")
    keeping = asyncio.create_task(keep_memory_schedules(client, settings, first_s=0.2))
    await asyncio.sleep(12)  # past the SDK's own retries of one call (~10 s)
    assert not keeping.done()
    server.start()
    made = await asyncio.wait_for(keeping, timeout=60)
    assert sorted(m.schedule_id for m in made) == sorted(memory_schedules(settings))
    assert "wait for Temporal" in caplog.text


def _text(log: Path) -> str:
    return log.read_text(errors="replace")
