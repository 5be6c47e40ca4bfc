"""A worker SIGKILLed at an activity boundary of a turn or of a checkpoint, right after
the step's write and before Temporal hears of it; another worker takes over. Exactly one
row per input, per reply, per tool result and per checkpoint; nothing lost.

Temporal notices a dead worker's activity only when its heartbeat times out (20 s; every
step here beats): each case takes 25-31 s (the checkpoint steps took ~2 min and recording
~36 s when their start-to-close was the end), so the default run takes the model-call
boundary; KEEL_CRASH_MATRIX=1 runs every boundary."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import psycopg
import pytest

from activities.workspace import open_store
from keel.client import KeelClient, session_config
from schemas.config import KeelSettings
from tests.checkpoint_model import CheckpointModel, good_checkpoint
from tests.fake_anthropic import text_message, tool_use_message
from tests.session.worker_process import start_worker

MATRIX = os.environ.get("KEEL_CRASH_MATRIX") == "1"
FILLER = " ".join(f"w{i % 97}" for i in range(1_000))
TURN = ["record_input", "call_model", "run_tool"]
CHECKPOINT = ["prepare_checkpoint", "flush_memory", "checkpoint_round",
              "validate_checkpoint", "store_checkpoint"]
# "ask:": the message asked in one update while the session is idle, so the crashed model
# call had recorded it too (its retry finds the row at its seq, and the reply).
ASKED = ["ask:call_model"]
DEFAULT = {"call_model", "ask:call_model"}
CASES = [pytest.param(step, marks=[] if MATRIX or step in DEFAULT else pytest.mark.skip(
    reason="slow (attempt timeout); KEEL_CRASH_MATRIX=1 runs it"))
    for step in TURN + ASKED + CHECKPOINT]


def _one_write(body: dict) -> dict:
    done = sum(1 for m in body["messages"] for b in m["content"]
               if isinstance(b, dict) and b.get("type") == "tool_result")
    return (tool_use_message([("write_file", {"path": "f.txt", "content": "1"})]) if done == 0
            else text_message("written"))


@pytest.mark.parametrize("step", CASES)
async def test_sigkill_at_a_boundary_loses_and_duplicates_nothing(
        step, temporal_env, database_url, fake_anthropic, tmp_path) -> None:
    checkpointing = step in CHECKPOINT
    fake_anthropic.responder = (CheckpointModel(good_checkpoint) if checkpointing
                                else _one_write)
    queue = f"cb-{uuid.uuid4().hex[:8]}"
    mark = tmp_path / "crashed"
    env = {**os.environ,
           "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
           "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": queue,
           "KEEL_DATA_DIR": str(tmp_path), "ANTHROPIC_BASE_URL": fake_anthropic.base_url,
           "ANTHROPIC_API_KEY": "test", "KEEL_CRASH_AT": step.removeprefix("ask:"),
           "KEEL_CRASH_MARK": str(mark)}
    settings = KeelSettings.from_env(env)
    keel = KeelClient(temporal_env.client, queue, settings)
    sid = f"cb-{uuid.uuid4().hex[:8]}"
    crashing = subprocess.Popen([sys.executable, "-m", "tests.crash_worker"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker: list[subprocess.Popen] = []

    async def take_over() -> None:  # the moment the worker dies, another one starts
        while crashing.poll() is None:
            await asyncio.sleep(0.05)
        worker.append(start_worker(env))

    taking_over = asyncio.create_task(take_over())
    try:
        config = (session_config(settings, context_window=12_000, max_output_tokens=512)
                  if checkpointing else None)
        session = await keel.start_session(sid, config=config)
        texts = ([f"Part {i}: {FILLER}" for i in range(8)] if checkpointing
                 else ["write the file"])
        seqs = []
        outcomes = []
        if step.startswith("ask:"):
            outcomes = [await asyncio.wait_for(session.ask(texts[0]), 150)]
            seqs = list(outcomes[0].input_seqs)
            texts = []
        for text in texts:
            seqs.append((await session.send(text)).seq)
            if checkpointing and not mark.exists():
                await asyncio.wait_for(session.wait_reply(seqs[-1]), 150)
            if mark.exists():
                break
        outcomes = outcomes or [await asyncio.wait_for(session.wait_reply(s), 150)
                                for s in seqs]
        for _ in range(200):  # the transcript is written after the reply
            if mark.exists() and worker:
                break
            await asyncio.sleep(0.05)
        assert mark.exists() and worker, "the worker never crashed"
    finally:
        taking_over.cancel()
        for proc in (crashing, *worker):
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert all(o.error is None for o in outcomes)
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT type, input_id FROM messages WHERE session_id=%s"
                            " ORDER BY seq", (sid,)).fetchall()
        checkpoints = conn.execute("SELECT count(*), count(DISTINCT checkpoint_id)"
                                   " FROM checkpoints").fetchone()
        assert checkpoints is not None  # an aggregate gives one row
    ids = [i for _, i in rows]
    assert len(ids) == len(set(ids))
    assert sum(1 for t, _ in rows if t == "user") == len(seqs)
    if checkpointing:
        assert checkpoints[0] == checkpoints[1] >= 1
    else:
        assert [t for t, _ in rows] == ["user", "assistant", "tool_result", "assistant"]
        stored = await open_store(settings).read(sid, "f.txt")  # the workspace store
        assert stored is not None and stored.data == b"1"
