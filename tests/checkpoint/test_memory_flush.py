"""The memory flush before a checkpoint, against the real SDK, Temporal, PostgreSQL and the
fake Messages API (with Anthropic's caching rules): its request shares the checkpoint
turn's prefix and reads it from the prompt cache; a flush that fails is recorded (status,
the event stream, a notice) and the checkpoint is stored all the same."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from keel.client import session_config
from schemas.events import EventType
from schemas.vault.rollup import RollupKind, request_kind
from tests.checkpoint_model import CheckpointModel, good_checkpoint
from tests.fake_anthropic import ErrorStep, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.session.streams import Reader

WINDOW, OUTPUT = 12_000, 512
FILLER = " ".join(f"w{i % 97}" for i in range(1_000))  # about 1,900 tokens


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def is_flush(body: dict[str, Any]) -> bool:
    found = request_kind(body)
    return found is not None and found[0] is RollupKind.FLUSH


def is_round(body: dict[str, Any]) -> bool:
    return any("This request comes from Keel" in str(b.get("text", ""))
               for m in body["messages"] if isinstance(m["content"], list)
               for b in m["content"])


def without_marks(value: Any) -> Any:
    """The request part with its cache breakpoints taken out, to compare content."""
    if isinstance(value, dict):
        return {k: without_marks(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [without_marks(v) for v in value]
    return value


async def run_until_checkpoint(client, settings, model, *, parts: int = 8):
    cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"mf-{uuid.uuid4().hex[:8]}", config=cfg)
        reader = Reader(keel, session.session_id)
        outcomes = [await session.ask("Never touch the billing module. " + FILLER)]
        for i in range(parts):
            outcomes.append(await session.ask(f"Part {i}: {FILLER}"))
            if (await session.status()).checkpoint_count:
                break
        await reader.until(lambda r: r.of(EventType.CHECKPOINT_STORED))
        reader.stop()
        status = await session.status()
    return session, status, outcomes, reader


async def test_the_flush_shares_the_checkpoint_turns_prefix_and_reads_it_from_the_cache(
        client, settings, fake_anthropic):
    model = CheckpointModel(good_checkpoint)
    anna = {"op": "ADD", "type": "contact", "title": "Anna", "field": "employer",
            "value": "TDI Group", "confidence": "EXTRACTED"}

    def responder(body: dict[str, Any]) -> Any:  # the flush writes a card, and only that
        return tool_use_message([("write_card", anna)]) if is_flush(body) else model(body)

    fake_anthropic.responder = responder
    _session, status, outcomes, _reader = await run_until_checkpoint(
        client, settings, model)
    assert status.checkpoint_count >= 1 and all(o.error is None for o in outcomes)
    card = settings.memory.vault_dir_for("default") / "cards" / "contacts" / "Anna.md"
    assert "TDI Group" in card.read_text()
    requests = fake_anthropic.requests
    i = next(i for i, r in enumerate(requests) if is_flush(r))
    flush = requests[i]
    first_round = next(r for r in requests[i + 1:] if is_round(r))
    # The same tools and system prompt, and the same conversation up to the instruction.
    assert flush["tools"] == first_round["tools"]
    assert flush["system"] == first_round["system"]
    # Both end in a user message holding the conversation's last blocks, then their own
    # instruction (the flush's, the checkpoint turn's): everything before those is the same.
    conversation = without_marks(flush["messages"])
    conversation[-1]["content"] = conversation[-1]["content"][:-1]
    turn = without_marks(first_round["messages"])[:len(conversation)]
    turn[-1]["content"] = turn[-1]["content"][:len(conversation[-1]["content"])]
    assert turn == conversation and len(conversation) > 2
    # Breakpoints from the one builder: the system prompt, the stable end, the last block.
    assert flush["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" in flush["messages"][-1]["content"][-1]
    usage = fake_anthropic.usages[i]
    assert usage.cache_read > usage.input  # most of the flush is read, not paid in full


async def test_a_failed_flush_is_recorded_and_the_checkpoint_is_stored(
        client, settings, fake_anthropic, database_url):
    model = CheckpointModel(good_checkpoint)

    def responder(body: dict[str, Any]) -> Any:
        if is_flush(body):  # the API refuses it: a retry cannot help
            return ErrorStep(400, message="flush refused by the test")
        return model(body)

    fake_anthropic.responder = responder
    session, status, outcomes, reader = await run_until_checkpoint(
        client, settings, model)
    assert status.checkpoint_count >= 1 and all(o.error is None for o in outcomes)
    assert status.last_error and status.last_error.startswith(
        "Memory flush failed before checkpoint 1:")
    assert "flush refused by the test" in status.last_error
    errors = [e for e in reader.of(EventType.ERROR) if e.where == "memory"]
    assert len(errors) == 1 and errors[0].message == status.last_error
    with psycopg.connect(database_url) as conn:
        notices = [r[0] for r in conn.execute(
            "SELECT content_text FROM messages WHERE session_id=%s AND type='notice'"
            " ORDER BY seq", (session.session_id,)).fetchall()]
    assert notices == [status.last_error]


async def test_a_flush_s_failed_attempt_is_told_on_the_stream_while_it_tries_again(
        client, settings, fake_anthropic):
    """The flush runs inside a checkpoint a person may wait on: its failed attempt (the API
    overloaded) is told at once, as the turn's and the checkpoint's own are; the next one
    answers and nothing is recorded as failed. Before, its retries were silent."""
    model = CheckpointModel(good_checkpoint)
    failed: list[bool] = []

    def responder(body: dict[str, Any]) -> Any:
        if is_flush(body) and not failed:
            failed.append(True)
            return ErrorStep(529, "overloaded_error", "Overloaded")
        return model(body)

    fake_anthropic.responder = responder
    _session, status, outcomes, reader = await run_until_checkpoint(client, settings, model)
    assert failed and status.checkpoint_count >= 1 and status.last_error is None
    assert all(o.error is None for o in outcomes)
    told = [e for e in reader.of(EventType.ERROR) if e.where == "model_retrying"]
    assert len(told) == 1 and "attempt 1 of 3" in told[0].message
    assert "Overloaded" in told[0].message
