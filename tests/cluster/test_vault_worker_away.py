"""With the vault worker away (stopped, or not yet started on its host), sessions go on with
long memory: a turn recalls from the index in PostgreSQL and answers; its transcript waits
in the queue its reply wrote, and the vault worker appends it when it comes back.

Real parts: the Temporal dev server, PostgreSQL, a session worker and, later, a vault worker
(each serving its own queue, as `keel worker` and `keel worker --vault` do), the real SDK
talking to the fake Messages API.
"""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from activities.vault.search import IndexDoc, index_documents
from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings
from workers.worker import Role


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def _transcript(database_url: str, session_id: str) -> tuple[int, int]:
    """(rows waiting in the transcript queue, transcript entries in the index)."""
    with psycopg.connect(database_url) as conn:
        waiting = conn.execute("SELECT count(*) FROM transcript_outbox WHERE session_id = %s",
                               (session_id,)).fetchone()
        entries = conn.execute("SELECT count(*) FROM memory_docs WHERE kind = 'daily'"
                               " AND session_id = %s", (session_id,)).fetchone()
    return (waiting or (0,))[0], (entries or (0,))[0]


async def test_turns_recall_while_the_vault_worker_is_away_and_their_transcript_waits(
        client, settings, fake_anthropic, database_url) -> None:
    fake_anthropic.responder = lambda body: text_message("After five tries.")
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await index_documents(conn, [IndexDoc(
            path="notes/billing.md", kind="note", title="Billing retries",
            body="We agreed the billing retries stop after five tries.")], scope="default")
    sid = f"away-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings, role=Role.SESSIONS) as keel:
        session = await keel.start_session(sid)
        outcome = await asyncio.wait_for(
            session.ask("When do the billing retries stop?"), timeout=30)
        assert outcome.error is None and outcome.reply_text == "After five tries."
        asked = fake_anthropic.requests[-1]["messages"][-1]["content"]
        fenced = asked[-2]["text"]
        assert fenced.startswith("<memory-context") and "five tries" in fenced
        assert _transcript(database_url, sid) == (1, 0)  # queued, not appended
        status = await session.status()
        assert status.last_error is None
    async with keel_worker(client, settings, role=Role.VAULT):
        for _ in range(300):
            if _transcript(database_url, sid) == (0, 2):  # the question and its answer
                break
            await asyncio.sleep(0.05)
    assert _transcript(database_url, sid) == (0, 2)
