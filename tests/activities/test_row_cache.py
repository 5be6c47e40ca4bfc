"""A worker's copy of window rows (`activities.row_cache`): a read that takes rows from it
gives the window the record holds, whatever was written, moved or removed since the last
read; and the copy stays within its bound."""

from __future__ import annotations

import psycopg
import pytest
from pydantic import ValidationError

from activities.db import apply_migrations
from activities.record import NewRow, ensure_session, insert_row
from activities.row_cache import RowCache, row_cache, row_chars
from activities.window import SERVERS, server_of, window_rows
from schemas.config import DEFAULT_ROW_CACHE_CHARS, KeelSettings
from schemas.messages import MessageType, RecordRow

SID = "cache-1"


async def _seed(conn: psycopg.AsyncConnection, rows: int = 8) -> None:
    await ensure_session(conn, SID, "u")
    for seq in range(1, rows + 1):
        kind = MessageType.USER if seq % 2 else MessageType.ASSISTANT
        content = None if seq % 2 else [{"type": "text", "text": f"reply {seq}"}]
        await insert_row(conn, NewRow(session_id=SID, seq=seq, input_id=f"in-{seq}",
                                      type=kind, text=f"row {seq}", turn=1, content=content))


async def _read(conn: psycopg.AsyncConnection, start: int = 1, upto: int = 100,
                ) -> list[RecordRow]:
    return await (await window_rows(conn, SID, start, upto, None)).fetch()


async def _uncached(conn: psycopg.AsyncConnection, start: int = 1,
                    upto: int = 100) -> list[RecordRow]:
    row_cache.clear()
    try:
        return await _read(conn, start, upto)
    finally:
        row_cache.clear()


@pytest.fixture(autouse=True)
def _empty_cache():
    row_cache.clear()
    yield
    row_cache.clear()


async def test_a_warm_read_is_the_record_and_reuses_what_is_unchanged(database_url):
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await _seed(conn)
        first = await _read(conn)
        # Edited (a branch's rewrite does this), overwritten (a fence), and appended.
        await conn.execute("UPDATE messages SET content_text = 'edited' WHERE session_id = %s"
                           " AND seq = 3", (SID,))
        await conn.execute(
            "INSERT INTO messages (session_id, seq, input_id, type, content_text, token_count,"
            " turn) VALUES (%s, 5, 'fence-5', 'notice', 'fenced', 1, 1) ON CONFLICT"
            " (session_id, seq) DO UPDATE SET content_text = EXCLUDED.content_text,"
            " type = EXCLUDED.type, input_id = EXCLUDED.input_id", (SID,))
        await insert_row(conn, NewRow(session_id=SID, seq=9, input_id="in-9",
                                      type=MessageType.USER, text="row 9", turn=2))
        second = await _read(conn)
        assert second == await _uncached(conn)
        assert [r.text for r in second] == ["row 1", "row 2", "edited", "row 4", "fenced",
                                            "row 6", "row 7", "row 8", "row 9"]
        # Unchanged rows are the very objects read before; changed ones are not.
        by_seq = {r.seq: r for r in first}
        assert [r.seq for r in second if r is by_seq.get(r.seq)] == [1, 2, 4, 6, 7, 8]


async def test_rows_rewound_deleted_or_moved_out_are_gone(database_url):
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await _seed(conn)
        await _read(conn)
        await conn.execute("UPDATE messages SET rewound_by = 'rw' WHERE session_id = %s AND"
                           " seq = 4", (SID,))
        await conn.execute("DELETE FROM messages WHERE session_id = %s AND seq = 6", (SID,))
        assert [r.seq for r in await _read(conn)] == [1, 2, 3, 5, 7, 8]
        # A checkpoint moves the window's start: what moved out is no longer held.
        assert [r.seq for r in await _read(conn, start=5)] == [5, 7, 8]
        held = row_cache.held((await server_of(conn), SID))
        assert sorted(held.rows) == [5, 7, 8]


async def test_a_row_named_below_the_newest_revision_is_read_whole(database_url):
    """A row the read does not send (its revision is not above the newest held) and this
    worker does not hold: written by another worker whose commit came late, or evicted.
    It is read from the record in the same call, as it is now."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await _seed(conn)
        await _read(conn)
        held = row_cache.held((await server_of(conn), SID))
        del held.rows[2], held.rows[7]
        again = await _read(conn)
        assert again == await _uncached(conn)
        assert [r.text for r in again if r.seq in (2, 7)] == ["row 2", "row 7"]


async def test_rows_held_from_another_run_of_the_server_are_not_taken(database_url):
    """A server that restarted, or a replica that took over, may hand out revisions again
    (the newest writes lost): what a worker held before is not taken for it. Here a write
    that keeps its revision (the trigger off) stands for such a reuse."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await _seed(conn)
        await _read(conn)
        await conn.execute("ALTER TABLE messages DISABLE TRIGGER messages_rev")
        await conn.execute("UPDATE messages SET content_text = 'after the failover' WHERE"
                           " session_id = %s AND seq = 3", (SID,))
        await conn.execute("ALTER TABLE messages ENABLE TRIGGER messages_rev")
        SERVERS[conn] = (await server_of(conn)).replace("@", "@another start, not ")
        again = await _read(conn)
        assert [r.text for r in again if r.seq == 3] == ["after the failover"]
        assert again == await _uncached(conn)


async def test_every_write_takes_a_new_revision_whatever_the_statement_says(database_url):
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await _seed(conn, rows=2)
        # A copied row (a bundle's import, a branch) carries no revision of this database.
        await conn.execute(
            "INSERT INTO messages (session_id, seq, input_id, type, content_text, token_count,"
            " rev) VALUES (%s, 3, 'in-3', 'user', 'row 3', 1, 1)", (SID,))
        revs = [r[0] for r in await (await conn.execute(
            "SELECT rev FROM messages WHERE session_id = %s ORDER BY seq", (SID,))).fetchall()]
        assert revs == sorted(set(revs)) and revs[-1] > 1
        await conn.execute("UPDATE messages SET turn = 1 WHERE session_id = %s AND seq = 1",
                           (SID,))
        updated = await (await conn.execute(
            "SELECT rev FROM messages WHERE session_id = %s AND seq = 1", (SID,))).fetchone()
        assert updated is not None and updated[0] > revs[-1]


def _row(seq: int, chars: int) -> RecordRow:
    return RecordRow(seq=seq, type=MessageType.USER, text="x" * chars, token_count=0)


def test_the_cache_keeps_within_its_bound_least_recently_read_first():
    one = row_chars(_row(1, 1000))
    cache = RowCache(max_chars=3 * one)
    for i in range(3):
        cache.keep(("db", f"s{i}"), [(1, _row(1, 1000))])
    assert cache.chars == 3 * one
    cache.held(("db", "s0"))  # read again: s1 is now the least recently read
    cache.keep(("db", "s3"), [(1, _row(1, 1000))])
    assert cache.chars == 3 * one
    assert cache.held(("db", "s1")).rows == {}
    assert all(cache.held(("db", s)).rows for s in ("s0", "s2", "s3"))
    # A session read again replaces what it held; one larger than the cache is not held.
    cache.keep(("db", "s0"), [(2, _row(1, 10)), (3, _row(2, 10))])
    assert sorted(cache.held(("db", "s0")).rows) == [1, 2]
    assert cache.held(("db", "s0")).newest_rev == 3
    cache.keep(("db", "big"), [(1, _row(1, 4 * one))])
    assert cache.held(("db", "big")).rows == {} and cache.chars <= 3 * one


def test_a_cache_of_size_zero_holds_nothing():
    cache = RowCache(max_chars=0)
    cache.keep(("db", "s"), [(1, _row(1, 10))])
    assert cache.held(("db", "s")).rows == {} and cache.chars == 0


def test_a_held_row_cannot_be_changed_in_place():
    row = _row(1, 10)
    with pytest.raises(Exception, match="frozen"):
        setattr(row, "text", "changed")  # noqa: B010 (the assignment under test)
    assert row.model_copy(update={"text": "copy"}).text == "copy" and row.text == "x" * 10


def test_the_bound_comes_from_the_settings_and_zero_turns_the_cache_off():
    assert KeelSettings.from_env({}).row_cache_chars == DEFAULT_ROW_CACHE_CHARS
    assert KeelSettings.from_env({"KEEL_ROW_CACHE_CHARS": "0"}).row_cache_chars == 0
    assert KeelSettings.from_env({"KEEL_ROW_CACHE_CHARS": "1000"}).row_cache_chars == 1000
    with pytest.raises(ValueError, match="KEEL_ROW_CACHE_CHARS is '-1', not a whole number, "
                                         "0 or more"):
        KeelSettings.from_env({"KEEL_ROW_CACHE_CHARS": "-1"})
    with pytest.raises(ValidationError, match="row_cache_chars"):  # a Python caller's
        KeelSettings(row_cache_chars=-1)


async def test_a_record_from_before_the_revisions_gets_them_and_reads_the_same(database_url):
    """Migration 010 on a database whose sessions hold messages already: each row gets its
    own revision, and windows read (and read again, from the cache) as they did."""
    with psycopg.connect(database_url, autocommit=True) as conn:  # as before migration 010
        conn.execute("DROP TRIGGER messages_rev ON messages")
        conn.execute("DROP FUNCTION messages_next_rev()")
        conn.execute("ALTER TABLE messages DROP COLUMN rev")
        conn.execute("DROP SEQUENCE message_rev")
        conn.execute("DELETE FROM schema_migrations WHERE name = '010_message_rev.sql'")
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await _seed(conn)
    assert apply_migrations(database_url) == ["010_message_rev.sql"]
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        revs = [r[0] for r in await (await conn.execute(
            "SELECT rev FROM messages WHERE session_id = %s", (SID,))).fetchall()]
        assert len(revs) == 8 and len(set(revs)) == 8
        first = await _read(conn)
        assert [r.text for r in first] == [f"row {n}" for n in range(1, 9)]
        assert await _read(conn) == first == await _uncached(conn)


async def test_a_role_that_may_not_ask_when_its_server_started_still_reads(database_url):
    """The server's start is asked beside an input's insert: for a role that may not ask
    it, the answer is none, never an error that would undo the insert."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await _seed(conn, rows=2)
        await conn.execute("CREATE ROLE keel_limited NOLOGIN")
        await conn.execute("GRANT SELECT ON messages, checkpoints TO keel_limited")
        await conn.execute("REVOKE EXECUTE ON FUNCTION pg_postmaster_start_time() FROM PUBLIC")
        try:
            await conn.execute("SET ROLE keel_limited")
            SERVERS.pop(conn, None)
            assert (await server_of(conn)).endswith("@")
            assert [r.seq for r in await _read(conn)] == [1, 2]
        finally:
            await conn.execute("RESET ROLE")
            await conn.execute("GRANT EXECUTE ON FUNCTION pg_postmaster_start_time() TO PUBLIC")
            await conn.execute("REVOKE ALL ON messages, checkpoints FROM keel_limited")
            await conn.execute("DROP ROLE keel_limited")
