"""The transcript outbox (activities.vault.outbox): a queued transcript reaches the daily
file in the order it was recorded, a row drained twice (a vault worker killed between the
append and the delete) appends nothing twice, and a row that keeps failing is retried,
holds its session's later rows back, then is said to the session and dropped."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import psycopg

from activities.vault import outbox, turn
from activities.vault.outbox import (
    MAX_ATTEMPTS,
    QueuedTranscript,
    TranscriptDrainer,
    queue_transcript,
)
from activities.vault.search import IndexDoc
from activities.vault.turn import MemoryActivities
from schemas.vault.rollup import split_transcript
from schemas.vault.scope import DEFAULT_SCOPE
from tests.vault.support import insert_messages, vault_ctx
from workers.worker import model_backends

T0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
QUEUE = "keel-vault"
DAY = "daily/2026-06-01.md"


async def _queue(database_url: str, session_id: str, reply_seq: int, seqs: list[int],
                 recalled: list[str] | None = None, scope: str = DEFAULT_SCOPE) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        async with conn.transaction():
            await queue_transcript(conn, QUEUE, QueuedTranscript(
                session_id=session_id, scope=scope, reply_seq=reply_seq, seqs=seqs,
                recalled=recalled or []))


def _outbox(database_url: str) -> list[tuple[str, int, int]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT session_id, reply_seq, attempts FROM transcript_outbox"
                            " ORDER BY id").fetchall()


def _drainer(ctx, database_url: str, told: list[tuple[str, str]],
             sweep_s: float = 2.0) -> TranscriptDrainer:
    async def report(session_id: str, message: str) -> None:
        told.append((session_id, message))
    return TranscriptDrainer(database_url, QUEUE, MemoryActivities(ctx, model_backends()),
                             report, sweep_s=sweep_s)


async def test_queued_transcripts_are_written_in_order_and_a_second_drain_adds_nothing(
        tmp_path, database_url) -> None:
    ctx = vault_ctx(tmp_path, database_url)
    insert_messages(database_url, "s1", [
        (1, "user", "The deploy key lives in the team vault.", T0),
        (2, "assistant", "Noted: the deploy key is in the team vault.", T0),
        (3, "user", "And the staging key in the other one.", T0),
        (4, "assistant", "Noted too.", T0)])
    await _queue(database_url, "s1", 2, [1, 2])
    await _queue(database_url, "s1", 2, [1, 2])  # a retried call: queued once
    await _queue(database_url, "s1", 4, [3, 4])
    assert [r[1] for r in _outbox(database_url)] == [2, 4]
    told: list[tuple[str, str]] = []
    drainer = _drainer(ctx, database_url, told)
    assert await drainer.drain_once() == 2
    assert _outbox(database_url) == [] and told == []
    text = ctx.vault.path(DAY).read_text()
    order = [text.index(s) for s in ("The deploy key lives", "Noted: the deploy",
                                     "And the staging key", "Noted too.")]
    assert order == sorted(order)
    # Killed after the append, before the delete: the row is drained again, and nothing
    # is appended twice.
    await _queue(database_url, "s1", 2, [1, 2])
    assert await drainer.drain_once() == 1
    again = ctx.vault.path(DAY).read_text()
    assert again == text and again.count("The deploy key lives") == 1


async def test_a_rewind_takes_its_entries_out_whichever_came_first(
        tmp_path, database_url) -> None:
    """A rewind's forget row takes the rewound messages' entries out of the day's file and
    the index, the rest byte for byte; a transcript drained after the rewind never writes
    a rewound message, though it was queued before it."""
    ctx = vault_ctx(tmp_path, database_url)
    insert_messages(database_url, "s1", [
        (1, "user", "Keep the words of the morning.", T0),
        (2, "assistant", "Kept.", T0),
        (3, "user", "The vault code is 4417.", T0),
        (4, "assistant", "Noted the code.", T0),
        (5, "user", "Also the locker is 12.", T0),
        (6, "assistant", "Noted the locker.", T0)])
    insert_messages(database_url, "s2", [(1, "user", "Another session's words.", T0)])
    await _queue(database_url, "s1", 2, [1, 2])
    await _queue(database_url, "s2", 1, [1])
    await _queue(database_url, "s1", 4, [3, 4])
    told: list[tuple[str, str]] = []
    drainer = _drainer(ctx, database_url, told)
    assert await drainer.drain_once() == 3
    before = ctx.vault.path(DAY).read_text()
    await _queue(database_url, "s1", 6, [5, 6])  # queued, not drained yet: then the rewind
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE messages SET rewound_by = 'r1' WHERE session_id = 's1'"
                     " AND seq > 2")
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
        async with aconn.transaction():
            await queue_transcript(aconn, QUEUE, QueuedTranscript(
                session_id="s1", scope=DEFAULT_SCOPE, reply_seq=6, seqs=[3, 4, 5, 6],
                recalled=[], forget=True))
    assert await drainer.drain_once() == 2
    assert _outbox(database_url) == [] and told == []
    after = ctx.vault.path(DAY).read_text()
    assert "4417" not in after and "locker" not in after
    assert split_transcript(after) == [e for e in split_transcript(before)
                                       if e[:2] not in (("s1", 3), ("s1", 4))]
    with psycopg.connect(database_url) as conn:
        docs = conn.execute("SELECT session_id, seq FROM memory_docs WHERE kind = 'daily'"
                            " ORDER BY session_id, seq").fetchall()
    assert docs == [("s1", 1), ("s1", 2), ("s2", 1)]


async def test_a_day_file_with_bytes_not_utf8_is_left_and_said(tmp_path, database_url):
    """A person's edit put bytes that are not UTF-8 in the day's file: the rewind's forget
    never rewrites it from a lossy reading; the session is told where its entries stay."""
    ctx = vault_ctx(tmp_path, database_url)
    insert_messages(database_url, "s1", [(1, "user", "Keep this.", T0),
                                         (2, "user", "The code is 4417.", T0)])
    await _queue(database_url, "s1", 2, [1, 2])
    told: list[tuple[str, str]] = []
    drainer = _drainer(ctx, database_url, told)
    assert await drainer.drain_once() == 1
    path = ctx.vault.path(DAY)
    path.write_bytes(path.read_bytes() + b"\n\xff a person's stray byte\n")
    before = path.read_bytes()
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as aconn:
        async with aconn.transaction():
            await queue_transcript(aconn, QUEUE, QueuedTranscript(
                session_id="s1", scope=DEFAULT_SCOPE, reply_seq=2, seqs=[2], recalled=[],
                forget=True))
    assert await drainer.drain_once() == 1
    assert path.read_bytes() == before and _outbox(database_url) == []
    assert told == [("s1", f"the rewound messages' entries stay in {DAY}: it holds bytes "
                           "that are not UTF-8, so Keel does not rewrite it (edit by hand)")]


async def test_a_backlog_is_written_a_scope_at_a_time_in_one_index_batch(
        tmp_path, database_url, monkeypatch) -> None:
    """Rows of several sessions waiting together (a busy deployment) are written in one go
    a scope: each entry in its own scope's day file, in the order recorded, one index
    batch a scope (the vault writer's cost a row falls as the backlog grows), and a note
    two turns recalled counted twice."""
    ctx = vault_ctx(tmp_path, database_url)
    batches: list[tuple[str, int]] = []
    index = turn.index_documents

    async def counted(conn, docs, *, scope, **kw):
        batches.append((scope, len(docs)))
        return await index(conn, docs, scope=scope, **kw)
    monkeypatch.setattr(turn, "index_documents", counted)
    pool = await ctx.pool()
    async with pool.connection() as aconn:
        await index(aconn, [IndexDoc(path="notes/deploy.md", kind="note", title="Deploy",
                                    body="The deploy key lives in the team vault.")],
                    scope=DEFAULT_SCOPE)
    for sid in ("s1", "s2", "s3"):
        insert_messages(database_url, sid, [(1, "user", f"{sid} asks about the deploy.", T0),
                                            (2, "assistant", f"{sid} is answered.", T0),
                                            (3, "user", f"{sid} says thanks.", T0)])
    await _queue(database_url, "s1", 2, [1, 2], recalled=["notes/deploy.md"])
    await _queue(database_url, "s3", 2, [1, 2], scope="team")
    await _queue(database_url, "s2", 2, [1, 2], recalled=["notes/deploy.md"])
    await _queue(database_url, "s1", 4, [3])
    await _queue(database_url, "s3", 4, [3], scope="team")
    told: list[tuple[str, str]] = []
    assert await _drainer(ctx, database_url, told).drain_once() == 5
    assert _outbox(database_url) == [] and told == []
    assert sorted(batches) == [(DEFAULT_SCOPE, 5), ("team", 3)]
    mine = ctx.vault.path(DAY).read_text()
    order = [mine.index(s) for s in ("s1 asks", "s1 is answered", "s2 asks",
                                     "s2 is answered", "s1 says thanks")]
    assert order == sorted(order) and "s3" not in mine
    team = ctx.scoped("team").vault.path(DAY).read_text()
    assert [team.count(f"s3 {w}") for w in ("asks", "is answered", "says")] == [1, 1, 1]
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT access_count FROM memory_docs WHERE path = %s",
                            ("notes/deploy.md",)).fetchone() == (2,)


async def test_a_failing_row_is_retried_holds_its_session_back_then_is_said_and_dropped(
        tmp_path, database_url) -> None:
    ctx = vault_ctx(tmp_path, database_url)
    insert_messages(database_url, "s1", [(1, "user", "First words of s1.", T0),
                                         (3, "user", "Later words of s1.", T0)])
    insert_messages(database_url, "s2", [(1, "user", "Words of s2.", T0)])
    await _queue(database_url, "s1", 2, [1, 2])  # seq 2 is not in the record: fails
    await _queue(database_url, "s1", 4, [3])
    await _queue(database_url, "s2", 2, [1])
    told: list[tuple[str, str]] = []
    drainer = _drainer(ctx, database_url, told)
    await drainer.drain_once()
    # s1's first row failed once and waits its retry; its later row waits behind it; s2's
    # was written.
    assert [(s, r, a) for s, r, a in _outbox(database_url)] == [("s1", 2, 1), ("s1", 4, 0)]
    text = ctx.vault.path(DAY).read_text()
    assert "Words of s2." in text and "Later words of s1." not in text
    await drainer.drain_once()
    assert _outbox(database_url)[0][2] == 1  # not due yet: not tried again
    for _ in range(MAX_ATTEMPTS - 1):
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("UPDATE transcript_outbox SET next_try_at = now()")
        await drainer.drain_once()
    assert told == [("s1", told[0][1])]
    assert told[0][1].startswith("the transcript of #1-#2 could not be written: ")
    assert "no message 2 in session s1" in told[0][1]
    assert _outbox(database_url) == []  # dropped, and the later row written after it
    assert "Later words of s1." in ctx.vault.path(DAY).read_text()


async def test_the_running_drainer_writes_on_notification(tmp_path, database_url):
    ctx = vault_ctx(tmp_path, database_url)
    insert_messages(database_url, "s1", [(1, "user", "Heard at once.", T0)])
    drainer = _drainer(ctx, database_url, [], sweep_s=3600)  # no sweep: the notification
    async with drainer.running():
        for _ in range(100):  # its first sweep done: from now on only a notification wakes it
            await asyncio.sleep(0.05)
            if drainer.sweeps:
                break
        await _queue(database_url, "s1", 2, [1])

        async def drained() -> None:
            while _outbox(database_url):
                await asyncio.sleep(0.02)
        await asyncio.wait_for(drained(), 30)
    assert "Heard at once." in ctx.vault.path(DAY).read_text()


async def test_stopping_ends_even_when_the_first_cancel_starts_a_wait_of_its_own(
        tmp_path, database_url, monkeypatch) -> None:
    """A drain that answers a cancel by waiting on something of its own (as psycopg waits
    for the server to end a cancelled query) must not hold the worker's stop: a second
    cancel ends that wait, and a drain that outlives both is left behind."""
    monkeypatch.setattr(outbox, "STOP_GRACE_S", 0.2)
    ctx = vault_ctx(tmp_path, database_url)
    for cancels_needed in (2, 3):
        seen = 0
        draining = asyncio.Event()

        async def drain_once(cancels_needed: int = cancels_needed,
                             draining: asyncio.Event = draining) -> int:
            nonlocal seen
            draining.set()
            while True:
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    seen += 1
                    if seen >= cancels_needed:
                        raise

        drainer = _drainer(ctx, database_url, [])
        monkeypatch.setattr(drainer, "drain_once", drain_once)
        async with drainer.running():
            await asyncio.wait_for(draining.wait(), 30)  # connected, listening, draining
            task = drainer._task
            started = time.monotonic()
        assert time.monotonic() - started < 1.0
        assert seen == min(cancels_needed, 2)
        assert task is not None and task.done() == (cancels_needed == 2)
        task.cancel()  # the one left behind: ended here, not by the loop's close
        await asyncio.wait({task})
