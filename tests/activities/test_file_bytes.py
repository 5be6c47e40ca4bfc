"""A window's files are read as descriptions; a request's bytes are fetched for the files it
sends, and held by digest (`activities.attachments.with_bytes`, `FileBytes`). Before, every
model call read every file of its window: a window of a hundred screenshots read them all."""

from __future__ import annotations

import psycopg
import pytest

from activities.attachments import FileBytes, with_bytes
from activities.record import NewRow, ensure_session, insert_row, load_rows
from activities.row_cache import row_cache
from activities.window import window_rows
from schemas.attachments import MAX_REQUEST_ATTACHMENTS, Attachment, describe, stored
from schemas.context import assemble_messages
from schemas.messages import MessageType
from tests.attached import image

SID = "file-bytes-1"
FILES = MAX_REQUEST_ATTACHMENTS + 5


@pytest.fixture(autouse=True)
def _empty_cache():
    row_cache.clear()
    yield
    row_cache.clear()


async def _seed(conn: psycopg.AsyncConnection) -> None:
    await ensure_session(conn, SID, "u")
    for seq in range(1, FILES + 1):
        data = image(40 + seq, 30)
        found = describe(f"shot-{seq}.png", data)
        assert isinstance(found, Attachment)
        await insert_row(conn, NewRow(
            session_id=SID, seq=seq, input_id=f"in-{seq}", type=MessageType.USER,
            text=f"shot {seq}", turn=seq, content={"attachments": [stored(found, data)]},
            extra_tokens=found.tokens))


async def test_a_request_reads_only_the_bytes_it_sends_and_once(database_url):
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await _seed(conn)
        rows = await (await window_rows(conn, SID, 1, 100, None)).fetch()
        assert len(rows) == FILES
        assert not any("data" in a for r in rows for a in r.content["attachments"])
        assert not any("data" in a for r in await load_rows(conn, SID, 1, 100)
                       for a in r.content["attachments"])
        held = FileBytes()
        filled = await with_bytes(conn, SID, rows, held)
    with_data = [r.seq for r in filled if "data" in r.content["attachments"][0]]
    assert with_data == list(range(FILES - MAX_REQUEST_ATTACHMENTS + 1, FILES + 1))
    messages, _ = assemble_messages(filled)
    assert sum(b["type"] == "image" for m in messages for b in m["content"]) == \
        MAX_REQUEST_ATTACHMENTS
    # The next call takes them from this worker's copy: no statement is sent.
    async with await psycopg.AsyncConnection.connect(database_url) as closed:
        pass
    again = await with_bytes(closed, SID, rows, held)
    assert again == filled


def test_the_copy_is_bounded_dropping_the_least_recently_sent():
    held = FileBytes(max_chars=10)
    held.keep("a", "12345")
    held.keep("b", "12345")
    assert held.get("a") == "12345"  # now the most recent
    held.keep("c", "1234")
    assert (held.get("a"), held.get("b"), held.get("c")) == ("12345", None, "1234")
    held.keep("d", "x" * 11)  # larger than the whole copy: not kept
    assert held.get("d") is None
