"""The fence over a seq the session gave up on, against a real PostgreSQL, with the
activities run as Temporal runs them (ActivityEnvironment): whichever comes first, the
late attempt or the tombstone, the seq ends up holding the tombstone, and the late
attempt is refused at once (never retried)."""

from __future__ import annotations

import psycopg
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.context import SessionContext
from activities.record import FenceInput
from activities.session import RecordInput, SessionActivities
from schemas.messages import MessageType
from tests.harness import make_settings
from workers.worker import model_backends


def _rows(url: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT seq, input_id, type, content_text FROM messages"
                            " ORDER BY seq").fetchall()


@pytest.fixture
def acts(database_url, tmp_path) -> SessionActivities:
    return SessionActivities(SessionContext(make_settings(database_url, tmp_path),
                                            model=model_backends()))


def _record(seq: int, text: str, input_id: str) -> RecordInput:
    return RecordInput(session_id="s1", seq=seq, input_id=input_id, type=MessageType.USER,
                       text=text)


async def test_late_insert_after_the_fence_is_refused(acts, database_url):
    env = ActivityEnvironment()
    await env.run(acts.fence_seq, FenceInput(session_id="s1", seq=1, text="lost"))
    with pytest.raises(ApplicationError) as refused:
        await env.run(acts.record_input, _record(1, "late", "m-1"))
    assert refused.value.type == "SeqAbandoned" and refused.value.non_retryable
    assert _rows(database_url) == [(1, "fence-1", "notice", "lost")]


async def test_fence_overwrites_an_insert_that_landed_first(acts, database_url):
    env = ActivityEnvironment()
    await env.run(acts.record_input, _record(1, "landed late", "m-1"))
    await env.run(acts.fence_seq, FenceInput(session_id="s1", seq=1, text="lost"))
    await env.run(acts.fence_seq, FenceInput(session_id="s1", seq=1, text="lost"))  # retried
    assert _rows(database_url) == [(1, "fence-1", "notice", "lost")]
    # The caller's retry of the same input id lands at its new seq, not on the old one.
    again = await env.run(acts.record_input, _record(2, "landed late", "m-1"))
    assert (again.seq, again.duplicate) == (2, False)


async def test_unstorable_text_is_refused_without_retry(acts, database_url):
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(acts.record_input, _record(1, "a\x00b", "m-1"))
    assert refused.value.type == "UnstorableData" and refused.value.non_retryable
    assert "NUL" in str(refused.value) and _rows(database_url) == []
