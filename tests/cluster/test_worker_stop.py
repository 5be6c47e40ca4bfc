"""A worker stopped while a model call runs (a rolling deploy's SIGTERM) lets the call
finish before it exits: the reply is recorded once and the API asked once, where the call
was cancelled and asked for again on the next worker (its tokens paid twice, its streamed
reply started over).

Real parts: the Temporal dev server, PostgreSQL, a Keel worker process (`python -m
workers.main`) and, after it, a worker in this process; the real SDK talking to the fake
Messages API, which holds the call until the test lets it answer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import psycopg

from keel.client import KeelClient
from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings

ROOT = Path(__file__).resolve().parents[2]


async def test_a_stopping_worker_lets_its_model_call_finish(client, database_url,
                                                             fake_anthropic, tmp_path):
    calling, release = threading.Event(), threading.Event()

    def held(body: dict) -> dict:
        calling.set()
        release.wait(30)
        return text_message("the whole answer")
    fake_anthropic.responder = held
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    env = {**os.environ, "TEMPORAL_ADDRESS": client.service_client.config.target_host,
           "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": settings.task_queue,
           "KEEL_DATA_DIR": str(tmp_path / "a"), "ANTHROPIC_BASE_URL":
           fake_anthropic.base_url, "ANTHROPIC_API_KEY": "test-key",
           "KEEL_SHUTDOWN_GRACE_S": "30"}
    worker = subprocess.Popen([sys.executable, "-m", "workers.main", "sessions"], env=env,
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sid = f"stop-{uuid.uuid4().hex[:8]}"
    try:
        session = await KeelClient(client, settings.task_queue, settings).start_session(sid)
        await session.send("a question that takes a while")
        assert await asyncio.to_thread(calling.wait, 60), "the model call never came"
        worker.send_signal(signal.SIGTERM)  # a deploy stops it mid-call
        await asyncio.sleep(1)
        assert worker.poll() is None  # still finishing the call
        release.set()
        assert await asyncio.to_thread(worker.wait, 30) == 0
    finally:
        release.set()
        if worker.poll() is None:
            worker.kill()
    async with keel_worker(client, settings) as keel:  # the next worker takes the turn on
        status = await keel.session(sid).status()
        for _ in range(200):
            if (status := await keel.session(sid).status()).phase == "idle":
                break
            await asyncio.sleep(0.1)
    assert status.turn == 1 and status.last_error is None
    assert len(fake_anthropic.requests) == 1  # asked once
    with psycopg.connect(database_url) as conn:
        replies = conn.execute("SELECT content_text FROM messages WHERE session_id = %s AND"
                               " type = 'assistant'", (sid,)).fetchall()
    assert replies == [("the whole answer",)]


def test_a_worker_with_a_wrong_setting_stops_at_once_saying_which(tmp_path: Path) -> None:
    # `python -m workers.main` let a setting's ValueError out as a traceback.
    env = {**os.environ, "TEMPORAL_ADDRESS": "myhost", "DATABASE_URL": "postgresql://db/k",
           "KEEL_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "workers.main"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr == ("a setting is wrong: TEMPORAL_ADDRESS is 'myhost', a host without "
                           "its port (Temporal's frontend listens on 7233 by default: "
                           "myhost:7233)\n")
