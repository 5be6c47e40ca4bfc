"""Bad input gets a clear error and loses nothing: a database that went away, a malformed
model reply."""

from __future__ import annotations

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
