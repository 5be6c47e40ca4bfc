"""A worker process killed with SIGKILL in the middle of a turn, then started again."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import psycopg

from keel.client import KeelClient
from tests.fake_anthropic import text_message, tool_use_message
from tests.session.worker_process import start_worker


def _slow_three_writes(body: dict) -> dict:
    time.sleep(0.4)  # long enough for the test to kill the worker while a call is open
    done = sum(1 for m in body["messages"] for b in m["content"]
               if isinstance(b, dict) and b.get("type") == "tool_result")
    if done < 3:
        return tool_use_message([("write_file", {"path": f"f{done}.txt", "content": str(done)})])
    return text_message("all three written")


async def test_sigkill_mid_turn_loses_and_duplicates_nothing(
        temporal_env, database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = _slow_three_writes
    queue = f"crash-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
           "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": queue,
           "KEEL_DATA_DIR": str(tmp_path), "ANTHROPIC_BASE_URL": fake_anthropic.base_url,
           "ANTHROPIC_API_KEY": "test"}
    from schemas.config import KeelSettings

    keel = KeelClient(temporal_env.client, queue, KeelSettings.from_env(env))
    session_id = f"crash-{uuid.uuid4().hex[:8]}"
    worker = start_worker(env)
    try:
        session = await keel.start_session(session_id)
        accepted = await session.send("write three files")
        # Kill once the first tool result is recorded: the turn is half done.
        for _ in range(300):
            with psycopg.connect(database_url) as conn:
                n = conn.execute("SELECT count(*) FROM messages WHERE session_id=%s AND"
                                 " type='tool_result'", (session_id,)).fetchone()[0]
            if n >= 1:
                break
            await asyncio.sleep(0.05)
        assert n >= 1
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        worker = start_worker(env)
        outcome = await asyncio.wait_for(session.wait_reply(accepted.seq), 90)
    finally:
        worker.terminate()
        worker.wait(10)
    assert outcome.reply_text == "all three written"
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT type, content_text FROM messages WHERE session_id=%s"
                            " ORDER BY seq", (session_id,)).fetchall()
    assert [t for t, _ in rows] == ["user"] + ["assistant", "tool_result"] * 3 + ["assistant"]
    assert [t for _, t in rows if _ == "tool_result"] == ["wrote f0.txt", "wrote f1.txt",
                                                          "wrote f2.txt"]
    # DATABASE_URL set: the files are in the PostgreSQL store, each written exactly once.
    with psycopg.connect(database_url) as conn:
        files = conn.execute("SELECT path, data, version FROM workspace_files WHERE scope=%s"
                             " ORDER BY path", (session_id,)).fetchall()
    assert [(p, bytes(d), v) for p, d, v in files] == [
        (f"f{i}.txt", str(i).encode(), 1) for i in range(3)]
