"""A worker killed in the middle of a checkpoint resumes at the same step: one attempt,
each round once, one checkpoint row, the model's edits applied once."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import psycopg

from keel.client import KeelClient, session_config
from schemas.config import KeelSettings
from tests.checkpoint_model import CheckpointModel, good_checkpoint
from tests.session.worker_process import start_worker

FILLER = " ".join(f"w{i % 97}" for i in range(1_000))


def slow_good_checkpoint(turn):
    time.sleep(0.6)
    return good_checkpoint(turn)


async def test_sigkill_mid_checkpoint_resumes_at_the_same_step(
        temporal_env, database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = CheckpointModel(slow_good_checkpoint)
    queue = f"ckcrash-{uuid.uuid4().hex[:8]}"
    env = {**os.environ,
           "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
           "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": queue,
           "KEEL_DATA_DIR": str(tmp_path), "ANTHROPIC_BASE_URL": fake_anthropic.base_url,
           "ANTHROPIC_API_KEY": "test"}
    settings = KeelSettings.from_env(env)
    keel = KeelClient(temporal_env.client, queue, settings)
    session_id = f"ckcrash-{uuid.uuid4().hex[:8]}"
    worker = start_worker(env)
    try:
        session = await keel.start_session(session_id, config=session_config(
            settings, context_window=12_000, max_output_tokens=512))
        await session.ask("Never touch the billing module. " + FILLER)
        sent = None
        for i in range(10):
            sent = await session.send(f"Part {i}: {FILLER}")
            for _ in range(100):  # wait for this turn, or for the checkpoint's first round
                with psycopg.connect(database_url) as conn:
                    row = conn.execute("SELECT rounds_used FROM checkpoint_attempts").fetchone()
                if row and row[0] >= 1:
                    break
                status = await session.status()
                if status.phase == "idle" and status.pending_inputs == 0:
                    break
                await asyncio.sleep(0.05)
            if row and row[0] >= 1:
                break
        assert row and row[0] == 1, "no checkpoint round was recorded"
        os.kill(worker.pid, signal.SIGKILL)  # the second round's model call is open
        worker.wait()
        worker = start_worker(env)
        outcome = await asyncio.wait_for(session.wait_reply(sent.seq), 120)
        mind = await session.mind()
    finally:
        worker.terminate()
        worker.wait(30)  # a graceful stop on a loaded machine can take a while
    assert outcome.error is None
    with psycopg.connect(database_url) as conn:
        attempts = conn.execute(
            "SELECT rounds_used, outcome, jsonb_array_length(rounds) FROM checkpoint_attempts"
        ).fetchall()
        checkpoints = conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
    assert attempts[0] == (2, "stored", 3)  # meta + two rounds, none repeated
    assert checkpoints >= 1
    assert mind.count("- Finish the user's long job") == 1
