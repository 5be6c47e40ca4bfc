"""Long memory failing under a running session is said, never silent, and holds no turn
up (the recall inside a turn's model call, workflows.turn `_took_recall`; the
background transcript, workflows.transcript): the turn is answered without memory; the
session's `last_error` and its event stream (ErrorEvent, where="memory") say what failed,
and the record keeps a notice for the failed recall."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from keel.events import Transport
from schemas.events import ErrorEvent
from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


async def _memory_errors(session, count: int) -> list[ErrorEvent]:
    found: list[ErrorEvent] = []

    async def read() -> None:
        async for _, event in session.events(after=0, transport=Transport.QUERY):
            if isinstance(event, ErrorEvent) and event.where == "memory":
                found.append(event)
                if len(found) >= count:
                    return

    await asyncio.wait_for(read(), 60)
    return found


async def test_a_failed_recall_and_transcript_are_said_and_the_turn_goes_on(
        client, settings, fake_anthropic, database_url):
    fake_anthropic.responder = lambda body: text_message("answered")
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"mf-{uuid.uuid4().hex[:8]}")
        first = await session.ask("We agreed the billing retries stop after five tries.")
        assert first.error is None
        for _ in range(200):  # the first turn's transcript is written after its reply
            with psycopg.connect(database_url) as conn:
                row = conn.execute("SELECT count(*) FROM memory_docs WHERE kind = 'daily'"
                                   ).fetchone()
            if row and row[0] >= 2:
                break
            await asyncio.sleep(0.05)
        with psycopg.connect(database_url, autocommit=True) as conn:  # the index goes away
            conn.execute("ALTER TABLE memory_docs RENAME TO memory_docs_away")
        outcome = await session.ask("What did we agree about the billing retries?")
        errors = await _memory_errors(session, 2)
        status = await session.status()
    assert outcome.error is None and outcome.reply_text == "answered"
    recall, transcript = errors
    assert recall.message.startswith("long memory could not be searched: ")
    assert "memory_docs" in recall.message
    assert transcript.message.startswith("the transcript of #")
    assert status.last_error == transcript.message
    with psycopg.connect(database_url) as conn:
        notices = [t for (t,) in conn.execute(
            "SELECT content_text FROM messages WHERE session_id = %s AND type = 'notice'"
            " ORDER BY seq", (session.session_id,))]
    assert len(notices) == 1
    assert notices[0].startswith("Long memory could not be searched this turn: ")
    # The model was asked without memory: no fenced block in the second turn's request.
    asked = fake_anthropic.requests[-1]["messages"][-1]["content"]
    assert not any("<memory-context" in b.get("text", "") for b in asked)
