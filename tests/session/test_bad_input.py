"""Bad input gets a clear error and loses nothing: a database that went away, a malformed
model reply."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from keel.client import MessageRejectedError, session_config
from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings
from workers.worker import Role


async def test_database_gone_rejects_the_message_then_nothing_is_lost(
        client, database_url, fake_anthropic, tmp_path):
    """Tried: a worker whose PostgreSQL is unreachable. The caller is told the message was
    not recorded and why, in PostgreSQL's words; once the database is back, the same
    message is recorded exactly once."""
    fake_anthropic.responder = lambda body: text_message("back")
    broken = make_settings(database_url.replace("keel_test_", "gone_"), tmp_path,
                           fake_anthropic.base_url)
    config = session_config(broken, record_timeout_s=3)
    sid = f"db-{uuid.uuid4().hex[:8]}"
    # Sessions only: the vault worker needs its database to hold the vault's lock.
    async with keel_worker(client, broken, role=Role.SESSIONS) as keel:
        session = await keel.start_session(sid, config=config)
        with pytest.raises(MessageRejectedError, match="could not be recorded") as caught:
            await session.send("keep this", input_id="msg-1")
        status = await session.status()
    assert status.pending_inputs == 0 and status.stopped_reason is None
    assert "PostgreSQL does not answer" in str(caught.value)
    assert 'database "gone_' in str(caught.value) and "does not exist" in str(caught.value)
    healthy = broken.model_copy(update={"database_url": database_url})
    async with keel_worker(client, healthy) as keel:
        session = keel.session(sid)
        first = await session.send("keep this", input_id="msg-1")
        again = await session.send("keep this", input_id="msg-1")  # a caller's retry
        outcome = await session.wait_reply(first.seq)
    assert again.seq == first.seq and outcome.reply_text == "back"
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT type, content_text FROM messages WHERE session_id=%s"
                            " ORDER BY seq", (sid,)).fetchall()
    # The seq given up on holds the fence notice: the first attempt can never fill it late.
    assert [t for t, _ in rows] == ["notice", "user", "assistant"]
    assert rows[0][1].startswith("A message from user could not be recorded and was lost")
    assert rows[1:] == [("user", "keep this"), ("assistant", "back")]


async def test_malformed_model_reply_is_reported_not_retried(
        client, database_url, fake_anthropic, tmp_path):
    """Tried: a 200 answer that is not a message. The turn ends with a clear error."""
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    fake_anthropic.push({"type": "message", "id": "m1", "role": "assistant",
                         "usage": {"input_tokens": 1, "output_tokens": 1}})
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"mf-{uuid.uuid4().hex[:8]}")
        outcome = await session.ask("hello")
    assert outcome.error and "malformed model reply" in outcome.error
    assert len(fake_anthropic.requests) == 1


async def test_a_step_that_cannot_take_its_data_ends_at_its_first_attempt(
        client, database_url, fake_anthropic, tmp_path, monkeypatch):
    """A ValueError in a step of the record's (here a built-in tool's code, made to raise
    one) is bad data or a bug: the step ends at its first attempt, the model reads that the
    call failed, and the turn goes on. It was retried like a database outage, for the tool
    call's ten minutes, and the turn stood still all that time."""
    import time

    import activities.session
    from tests.fake_anthropic import tool_use_message

    async def cannot_take(ctx: object, name: str, args: object) -> object:
        raise ValueError("a value no retry mends")

    monkeypatch.setattr(activities.session, "execute_tool", cannot_take)
    fake_anthropic.push(tool_use_message([("read_file", {"path": "notes.md"})]),
                        text_message("The read failed; going on."))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    sid = f"ve-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(sid)
        started = time.monotonic()
        outcome = await asyncio.wait_for(session.ask("Read notes.md"), 60)
        took = time.monotonic() - started
    assert outcome.reply_text == "The read failed; going on." and took < 20, took
    with psycopg.connect(database_url) as conn:
        said = [r[0] for r in conn.execute(
            "SELECT content_text FROM messages WHERE session_id = %s ORDER BY seq", (sid,))]
    assert any("read_file failed" in s and "a value no retry mends" in s for s in said), said
