"""Checkpoints under the API's own accounting (issue 20), against the real SDK, Temporal
and PostgreSQL: a request the API refuses as too long is the ladder's input in a normal
turn and inside a checkpoint, and no user request leaves the context without a tick."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from keel.client import session_config
from tests.checkpoint_model import (
    MARKER,
    CheckpointModel,
    CheckpointTurn,
    add_mission,
    good_checkpoint,
    now_block,
    texts,
)
from tests.fake_anthropic import ErrorStep, text_message, tool_use_message
from tests.harness import keel_worker, make_settings

WINDOW, OUTPUT = 12_000, 512
BLOCK = " ".join(f"w{i % 97}" for i in range(1_500))  # about 2,900 tokens
TOO_LONG = [r for r in ("prompt is too long", "exceed context limit")]


def _settings(database_url, tmp_path, fake):
    fake.context_window = WINDOW  # the model's window, as the API holds it
    return make_settings(database_url, tmp_path, fake.base_url)


def _too_long(fake) -> list[str]:
    return [r.message for r in fake.rejections if any(t in r.message for t in TOO_LONG)]


def working_turns() -> Any:
    """Agent turns with two big tool rounds each: write a file, read it back, answer."""
    progress: dict[str, int] = {}

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        asks = re.findall(r"Request (\d+):", json.dumps(body))
        ask = max(asks, key=int) if asks else "0"
        step = progress[ask] = progress.get(ask, -1) + 1
        if step == 0:
            return tool_use_message([("write_file", {"path": f"n{ask}.txt", "content": BLOCK})])
        if step == 1:
            return tool_use_message([("read_file", {"path": f"n{ask}.txt"})])
        return text_message("Done with that part.")

    return respond


def never_ticks(turn: CheckpointTurn) -> dict[str, Any]:
    """A checkpoint writer that edits its mind and writes the now, and never ticks."""
    if turn.round == 0 and not turn.final_only:
        return tool_use_message([add_mission(turn.mind, f"Job {uuid.uuid4().hex[:6]}")])
    return text_message("Checkpoint written.\n" + now_block())


def _all_text(request: dict[str, Any]) -> str:
    return json.dumps(request, ensure_ascii=False)


async def test_a_writer_that_never_ticks_loses_no_request_of_a_turn(
        client, fake_anthropic, database_url, tmp_path):
    settings = _settings(database_url, tmp_path, fake_anthropic)
    model = CheckpointModel(never_ticks, ordinary=working_turns())
    fake_anthropic.responder = model
    cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT)
    asks = [f"Request {n}: review batch {n} of the queue and keep the order {n}{n}."
            for n in range(1, 6)]
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"t-{uuid.uuid4().hex[:8]}", config=cfg)
        for ask in asks:
            outcome = await session.ask(ask)
            assert outcome.error is None, outcome.error
        status = await session.status()
    assert status.checkpoint_count >= 4  # a checkpoint inside every turn but the first
    # Each request, word for word, in every request the agent was sent after it (memo or
    # conversation; a checkpoint turn over an earlier part is shown only that part).
    agent = [_all_text(r) for r in fake_anthropic.requests
             if MARKER not in _all_text(r) and "<keel:rollup" not in _all_text(r)]
    for ask in asks:
        first = next(i for i, text in enumerate(agent) if ask in text)
        missing = [i for i, text in enumerate(agent[first:], first) if ask not in text]
        assert not missing, (ask, missing[:3])
    assert not _too_long(fake_anthropic)


async def test_a_turn_refused_as_too_long_is_answered_in_that_turn(
        client, fake_anthropic, database_url, tmp_path):
    settings = _settings(database_url, tmp_path, fake_anthropic)
    fake_anthropic.responder = CheckpointModel(good_checkpoint)
    cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"t-{uuid.uuid4().hex[:8]}", config=cfg)
        assert (await session.ask(f"Part 0: {BLOCK}")).error is None
        before = (await session.status()).checkpoint_count
        # The model's tokenizer turns out to count 60% more than Keel's estimate: the next
        # request passes the window under the API's count, though not under Keel's.
        fake_anthropic.skew = 1.6
        outcome = await session.ask(f"Part 1: {BLOCK}")
        refused = len(_too_long(fake_anthropic))
        assert outcome.error is None and outcome.reply_text == "noted"
        assert refused >= 1
        status = await session.status()
        assert status.checkpoint_count > before  # the ladder made room in that turn
        # The estimate learned the API's count: the turns after it are not refused.
        for n in range(2, 5):
            assert (await session.ask(f"Part {n}: {BLOCK}")).error is None
        assert len(_too_long(fake_anthropic)) == refused
        assert status.stopped_reason is None


async def test_a_round_refused_mid_checkpoint_keeps_what_earlier_rounds_wrote(
        client, fake_anthropic, database_url, tmp_path):
    settings = _settings(database_url, tmp_path, fake_anthropic)

    def behaviour(turn: CheckpointTurn) -> dict[str, Any]:
        if turn.round == 0:
            # The next round's request will be refused as too long, once.
            fake_anthropic.push(ErrorStep(400, "invalid_request_error",
                                          "prompt is too long: 11900 tokens > 11488 maximum"))
            return tool_use_message([add_mission(turn.mind, "Keep the first round's edit")])
        return text_message("Checkpoint written.\n" + now_block())

    model = CheckpointModel(behaviour)
    fake_anthropic.responder = model
    cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"t-{uuid.uuid4().hex[:8]}", config=cfg)
        for n in range(4):
            assert (await session.ask(f"Part {n}: {BLOCK}")).error is None
        status = await session.status()
        mind = await session.mind()
    assert status.checkpoint_count >= 1
    assert "- Keep the first round's edit" in mind
    # The request after the refusal asked for the now alone.
    last_only = [r for r in model.checkpoint_requests
                 if (r.get("tool_choice") or {}).get("type") == "none"]
    assert last_only and any("Checkpoint written" not in t for t in texts(
        last_only[0]["messages"][-1]))
