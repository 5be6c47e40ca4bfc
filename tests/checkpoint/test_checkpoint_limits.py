"""When the request no longer fits: move the earliest half out without the model, cut the
newest tool output, and stop with the "too long" message when nothing more can move."""

from __future__ import annotations

import asyncio
import re
import uuid

import psycopg
import pytest

from keel.client import MessageRejectedError, session_config
from tests.checkpoint_model import CheckpointModel
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings, start_flooded
from workflows.turn import TOO_LONG_MESSAGE

WINDOW, OUTPUT = 12_000, 512


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    fake_anthropic.context_window = WINDOW
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def db(database_url: str, sql: str, *args) -> list[tuple]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(sql, args).fetchall()


def failing_checkpoints(turn) -> dict:
    return text_message("I cannot write a now.")


async def test_move_half_when_no_checkpoint_can_be_taken(client, settings, fake_anthropic,
                                                         database_url):
    fake_anthropic.responder = CheckpointModel(failing_checkpoints)
    big = " ".join(f"w{i % 97}" for i in range(900))  # about 1,800 tokens
    cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"m-{uuid.uuid4().hex[:8]}", config=cfg)
        first = await session.ask("Only use the staging database.")
        outcomes = [first]
        for i in range(9):
            outcomes.append(await session.ask(f"Part {i}: {big}"))
        status = await session.status()
        memo = await session.memo()
    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    moves = db(database_url, "SELECT cut_seq, memo, fallbacks FROM checkpoints"
               " WHERE kind='move_half' ORDER BY created_at")
    assert moves, "the move-half path never ran"
    assert db(database_url, "SELECT count(*) FROM checkpoints WHERE kind='model'") == [(0,)]
    cut, entries, fallbacks = moves[0]
    moved_users = [r[0] for r in db(database_url, "SELECT seq FROM messages WHERE type='user'"
                                    " AND seq < %s ORDER BY seq", cut)]
    entries_and_dropped = db(database_url, "SELECT memo_dropped_seqs FROM checkpoints"
                             " WHERE kind='move_half' ORDER BY created_at")[0][0]
    assert sorted([e["seq"] for e in entries] + entries_and_dropped) == moved_users
    assert "Only use the staging database." in memo
    assert any("without the model" in f for f in fallbacks)
    # Each failed checkpoint was tried at most twice in a turn, never in a loop.
    attempts = db(database_url, "SELECT count(*) FROM checkpoint_attempts")[0][0]
    assert attempts <= 2 * status.turn
    assert status.checkpoint_count == len(moves)


async def test_newest_tool_output_alone_too_big_is_cut_to_fit(client, settings,
                                                              fake_anthropic, database_url):
    def ordinary(body: dict) -> dict:
        last = body["messages"][-1]["content"]
        results = [b for b in last if isinstance(b, dict) and b.get("type") == "tool_result"]
        if results:
            return text_message(f"read {len(results[0]['content'])} characters")
        return tool_use_message([("read_file", {"path": "huge.log"})])

    fake_anthropic.responder = CheckpointModel(failing_checkpoints, ordinary=ordinary)
    cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT)
    session_id = f"t-{uuid.uuid4().hex[:8]}"
    workspace = settings.workspaces_dir / session_id
    workspace.mkdir(parents=True)
    (workspace / "huge.log").write_text(" ".join(f"e{i % 89}" for i in range(12_000)))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(session_id, config=cfg)
        outcome = await session.ask("Read huge.log")
    assert outcome.error is None and outcome.reply_text.startswith("read ")
    seen = fake_anthropic.requests[-1]["messages"]
    result = next(b for m in seen for b in m["content"]
                  if isinstance(b, dict) and b.get("type") == "tool_result")
    assert "Keel cut this tool output to fit the context" in result["content"]
    recorded = db(database_url, "SELECT content_text FROM messages WHERE type='tool_result'")
    assert len(recorded[0][0]) > len(result["content"])  # the record keeps it whole


async def test_nothing_left_to_move_stops_with_the_too_long_message(
        client, settings, fake_anthropic, database_url):
    fake_anthropic.responder = CheckpointModel(failing_checkpoints)
    cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT)
    async with keel_worker(client, settings) as keel:
        session = await start_flooded(keel, fake_anthropic, f"l-{uuid.uuid4().hex[:8]}", cfg)
        for _ in range(200):
            status = await session.status()
            if status.stopped_reason:
                break
            await asyncio.sleep(0.05)
        assert status.stopped_reason == TOO_LONG_MESSAGE
        with pytest.raises(MessageRejectedError, match="stopped"):
            await session.send("are you there?")
        result = await session.handle.result()
    assert result.stopped_reason == TOO_LONG_MESSAGE
    notices = db(database_url, "SELECT content_text FROM messages WHERE type='notice'")
    # The notice says what the request took: the API's count against its maximum (the
    # provider's window of 6,000 tokens), the part every request carries, which no
    # checkpoint could move, and the largest of the rest, by its number.
    said = re.fullmatch(re.escape(TOO_LONG_MESSAGE) + r" The next request: the API counted "
                        r"([\d,]+) tokens against its ([\d,]+); about ([\d,]+) of them are "
                        r"what every request carries \(Keel's system prompt with the agent's "
                        r"instructions and AGENTS\.md files, and the tool definitions\)\. "
                        r"The largest of the rest is #(\d+), (.+): about ([\d,]+) tokens\.",
                        notices[-1][0])
    assert said, notices[-1][0]
    counted, maximum, fixed = (int(said[i].replace(",", "")) for i in (1, 2, 3))
    assert counted > maximum == 6_000 and 300 < fixed < 3_000
    seq, kind, tokens = int(said[4]), said[5], int(said[6].replace(",", ""))
    (watch,) = db(database_url, "SELECT seq, token_count FROM messages WHERE type='harness'")
    assert (seq, kind) == (watch[0], "a background input")  # the flood, the one input
    assert 0.5 * watch[1] <= tokens < counted
    assert "Start a new session with /new, or fork this one" in TOO_LONG_MESSAGE


async def test_a_message_that_cannot_fit_is_refused_before_recording(
        client, settings, database_url):
    cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"r-{uuid.uuid4().hex[:8]}", config=cfg)
        with pytest.raises(MessageRejectedError, match="at most 5744"):
            await session.send(" ".join(f"y{i % 71}" for i in range(4_000)))
    assert db(database_url, "SELECT count(*) FROM messages") == [(0,)]
