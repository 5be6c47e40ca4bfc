"""The agent turn through the real SDK against the fake Messages API."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from typing import Any

import psycopg
import pytest

from keel.client import MessageRejectedError, SessionExistsError
from schemas.checkpoint.request import REQUEST_MARKER as MARKER
from tests.checkpoint_model import CheckpointModel, good_checkpoint
from tests.fake_anthropic import ErrorStep, text_message, tool_use_message
from tests.harness import keel_worker, make_settings


def rows(database_url: str, session_id: str) -> list[tuple]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT seq, type, source_line, content_text FROM messages WHERE session_id=%s"
            " ORDER BY seq", (session_id,)).fetchall()


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


async def test_plain_reply_is_recorded(client, settings, fake_anthropic, database_url):
    fake_anthropic.push(text_message("Hello, I am here."))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        outcome = await session.ask("Hi there")
        assert outcome.reply_text == "Hello, I am here."
        status = await session.status()
    recorded = rows(database_url, session.session_id)
    assert [(r[1], r[3]) for r in recorded] == [("user", "Hi there"),
                                               ("assistant", "Hello, I am here.")]
    assert status.turn == 1 and status.phase == "idle"
    sent = fake_anthropic.requests[0]
    assert sent["messages"][-1]["content"][-1]["text"] == "Hi there"


async def test_tool_use_over_several_rounds(client, settings, fake_anthropic, database_url):
    fake_anthropic.push(
        tool_use_message([("write_file", {"path": "notes/a.txt", "content": "alpha"})]),
        tool_use_message([("read_file", {"path": "notes/a.txt"}),
                          ("read_file", {"path": "../escape.txt"})]),
        text_message("Done: the file says alpha."),
    )
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        outcome = await session.ask("Write alpha to notes/a.txt and read it back")
    assert outcome.reply_text == "Done: the file says alpha."
    recorded = rows(database_url, session.session_id)
    assert [r[1] for r in recorded] == [
        "user", "assistant", "tool_result", "assistant", "tool_result", "tool_result",
        "assistant"]
    assert recorded[4][3] == "alpha"
    assert "outside the session's workspace" in recorded[5][3]
    third = fake_anthropic.requests[2]["messages"]
    results = [b for b in third[-1]["content"] if b["type"] == "tool_result"]
    assert next(r["content"] for r in results) == "alpha"
    assert results[1]["is_error"] is True


async def test_overloaded_then_success_is_retried(client, settings, fake_anthropic):
    fake_anthropic.push(ErrorStep(529, "overloaded_error"), text_message("after retry"))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        outcome = await session.ask("hello")
    assert outcome.reply_text == "after retry"
    assert len(fake_anthropic.requests) == 2


async def test_bad_request_is_not_retried_and_reported(client, settings, fake_anthropic,
                                                       database_url):
    fake_anthropic.push(ErrorStep(400, "invalid_request_error", "bad request body"),
                        text_message("should never be asked for"))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        outcome = await session.ask("hello")
        status = await session.status()
    assert len(fake_anthropic.requests) == 1
    assert outcome.error and "400" in outcome.error
    assert status.last_error and "400" in status.last_error
    assert rows(database_url, session.session_id)[-1][1] == "notice"


async def test_messages_validated_before_anything_is_written(client, settings, database_url):
    settings.max_message_chars = 50
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}",
                                           config=None)
        with pytest.raises(MessageRejectedError, match="empty"):
            await session.send("   ")
        with pytest.raises(MessageRejectedError, match="limit is 50"):
            await session.send("x" * 51)
        with pytest.raises(SessionExistsError):
            await keel.start_session(session.session_id)
    assert rows(database_url, session.session_id) == []


async def test_update_with_start_acknowledges_the_first_message_once(
        client, settings, fake_anthropic, database_url):
    fake_anthropic.responder = lambda body: text_message("hi")
    async with keel_worker(client, settings) as keel:
        sid = f"s-{uuid.uuid4().hex[:8]}"
        session, accepted = await keel.start_with_message(sid, "first words")
        again, second = await keel.start_with_message(sid, "second words")
        await session.wait_reply(second.seq)
    assert accepted.seq == 1 and second.seq > accepted.seq
    assert again.session_id == session.session_id
    texts = [r[3] for r in rows(database_url, sid) if r[1] == "user"]
    assert texts == ["first words", "second words"]  # one session, both recorded once


async def _scheduled(session, database_url: str, want: int) -> tuple[list[str], Any]:
    """The activities the session's history scheduled, once the vault's daily transcript
    holds `want` of its entries (queued with each reply, written by the vault worker)."""
    from temporalio.api.enums.v1 import EventType

    for _ in range(200):  # a turn's transcript comes after its reply
        with psycopg.connect(database_url) as conn:
            row = conn.execute("SELECT count(*) FROM memory_docs WHERE kind = 'daily'"
                               " AND session_id = %s", (session.session_id,)).fetchone()
        if row and row[0] >= want:
            break
        await asyncio.sleep(0.05)
    history = await session.handle.fetch_history()
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name
                 for e in history.events if e.event_type ==
                 EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    return scheduled, history


async def test_a_plain_turn_is_one_update_and_one_activity_before_its_reply(
        client, settings, fake_anthropic, database_url):
    """The turn path of issue 10: a message asked while the session is idle is one ASK
    update, and its record, its recall and the model call are one activity (call_model),
    which queues the turn's transcript with its reply: nothing is scheduled after the reply
    (the vault worker writes the daily transcript). No local activity (no marker), and a
    short streamed reply costs no publish signal: its text reaches the stream with the
    reply. send + await_reply record first, by an activity of their own."""
    from temporalio.api.enums.v1 import EventType

    fake_anthropic.responder = lambda body: text_message("Noted.")
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        asked = await session.ask("Remember the billing retries stop after five tries.")
        accepted = await session.send("And the auth retries after three tries.")
        waited = await session.wait_reply(accepted.seq)
        scheduled, history = await _scheduled(session, database_url, 4)
        deltas = [e async for e in _deltas(session, asked.reply_seq)]
    assert (asked.reply_text, waited.reply_text) == ("Noted.", "Noted.")
    assert scheduled == ["call_model", "record_input", "call_model"]
    kinds = [e.event_type for e in history.events]
    # The turn's last event is its Update's completion: no workflow task after the reply.
    assert kinds[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED
    assert EventType.EVENT_TYPE_MARKER_RECORDED not in kinds
    assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED not in kinds
    assert "".join(d.text for d in deltas) == "Noted."
    updates = [e.workflow_execution_update_accepted_event_attributes.accepted_request.input
               .name for e in history.events if e.event_type ==
               EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED]
    assert updates == ["ask", "send_message", "await_reply"]
    assert [(r[1], r[3]) for r in rows(database_url, session.session_id)] == [
        ("user", "Remember the billing retries stop after five tries."),
        ("assistant", "Noted."), ("user", "And the auth retries after three tries."),
        ("assistant", "Noted.")]


async def _deltas(session, reply_seq: int | None):
    from keel.events import Transport
    from schemas.events import TextDelta, TurnEnded

    ended = 0
    async for _, event in session.events(after=0, transport=Transport.QUERY):
        if isinstance(event, TextDelta) and event.reply_seq == reply_seq:
            yield event
        if isinstance(event, TurnEnded):
            ended += 1
            if ended >= 2:
                return


async def test_a_message_asked_during_a_turn_is_recorded_at_once_and_a_retry_once(
        client, settings, fake_anthropic, database_url):
    """Only a message asked while the session is idle waits for its turn's model call to be
    recorded: one asked while a turn runs is recorded by its own activity as it arrives
    (its seq before the running turn's later rows). An ask that repeats an input id already
    recorded (another update id: a caller's retry after a lost answer) records nothing and
    asks the model nothing: it gets the earlier input's outcome."""
    from schemas.session import Handler, TurnOutcome, UserMessage

    release = threading.Event()

    def respond(body):
        last = body["messages"][-1]["content"]
        text = last if isinstance(last, str) else " ".join(
            b.get("text", "") for b in last if isinstance(b, dict))
        if "a slow one" in text:
            release.wait(30)  # the fake answers on its own thread
            return text_message("re: slow")
        return text_message("re: during")

    fake_anthropic.responder = respond
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        slow = asyncio.create_task(session.ask("a slow one", input_id="in-slow"))
        for _ in range(200):
            if (await session.status()).phase == "running":
                break
            await asyncio.sleep(0.05)
        during = asyncio.create_task(session.ask("asked during", input_id="in-during"))
        for _ in range(200):
            if (await session.status()).pending_inputs >= 2:  # recorded while it runs
                break
            await asyncio.sleep(0.05)
        waiting_during = (await session.status()).pending_inputs
        release.set()
        first, second = await slow, await during
        calls = len(fake_anthropic.requests)
        again = await session.handle.execute_update(
            Handler.ASK, UserMessage(text="asked during", input_id="in-during"),
            id="a-retry-with-another-update-id", result_type=TurnOutcome)
        scheduled, _ = await _scheduled(session, database_url, 4)
    assert waiting_during == 2
    assert (first.reply_text, second.reply_text) == ("re: slow", "re: during")
    assert again.input_seqs == second.input_seqs and again.error in (
        None, "that input was answered earlier")
    assert len(fake_anthropic.requests) == calls  # the retry asked the model nothing
    assert scheduled.count("record_input") == 1  # only the message asked during the turn
    texts = [(r[1], r[3]) for r in rows(database_url, session.session_id)]
    assert texts == [("user", "a slow one"), ("assistant", "re: slow"),
                     ("user", "asked during"), ("assistant", "re: during")]


async def test_a_failed_attempt_is_told_on_the_stream_while_the_call_tries_again(
        client, settings, fake_anthropic):
    """A model API that fails (overloaded, away) is tried again for minutes: the session's
    readers hear of each failed attempt at once (`keel send --wait`, `keel chat`), not only
    of the turn's end. Before, nothing showed until the retries ran out (7 min)."""
    fake_anthropic.push(ErrorStep(529, "overloaded_error", "Overloaded"),
                        text_message("after retry"))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        outcome = await session.ask("hello")
        events = []
        async for _, event in session.events(after=0):
            events.append(event)
            if event.type == "turn_ended":
                break
    assert outcome.reply_text == "after retry" and outcome.error is None
    told = [e for e in events if e.type == "error"]
    assert len(told) == 1 and told[0].where == "model_retrying" and told[0].turn == 1
    assert "attempt 1 of 12" in told[0].message and "Overloaded" in told[0].message
    assert [e.type for e in events].index("error") < [e.type for e in events].index(
        "turn_ended")


async def test_a_checkpoint_rounds_failed_attempt_is_told_too(client, settings, fake_anthropic):
    """A checkpoint's model call is tried again as well (8 attempts): a person waiting on
    the checkpoint hears of the failed one at once."""
    model = CheckpointModel(good_checkpoint)
    failed: list[bool] = []

    def responder(body: dict[str, Any]) -> Any:
        if MARKER in json.dumps(body.get("messages", [])) and not failed:
            failed.append(True)
            return ErrorStep(529, "overloaded_error", "Overloaded")
        return model(body)
    fake_anthropic.responder = responder
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        await session.ask("hello")
        status = await session.checkpoint_now()
        told = [e async for _, e in _until_stored(session)]
    assert status.checkpoint_count == 1 and failed
    retries = [e for e in told if e.type == "error" and e.where == "model_retrying"]
    assert len(retries) == 1 and "attempt 1 of 8" in retries[0].message


async def _until_stored(session):
    async for offset, event in session.events(after=0):
        yield offset, event
        if event.type == "checkpoint_stored":
            return
