"""The conversation of record in PostgreSQL: idempotent inserts and window loads."""

from __future__ import annotations

import json
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from pydantic import BaseModel

from schemas.messages import MessageType, RecordRow
from schemas.tokens import count_tokens


class NewRow(BaseModel):
    session_id: str
    seq: int
    input_id: str
    type: MessageType
    text: str
    source_line: str | None = None
    content: list[dict[str, Any]] | dict[str, Any] | None = None
    turn: int | None = None
    token_text: str | None = None  # what to count when it differs from `text`


class Inserted(BaseModel):
    seq: int
    token_count: int
    duplicate: bool = False


async def ensure_session(conn: AsyncConnection, session_id: str, user_name: str) -> None:
    await conn.execute(
        "INSERT INTO sessions (session_id, user_name) VALUES (%s, %s) "
        "ON CONFLICT (session_id) DO NOTHING",
        (session_id, user_name),
    )


async def insert_row(conn: AsyncConnection, row: NewRow) -> Inserted:
    """Insert once: a retry with the same input id returns the row already there."""
    prefix = f"{row.source_line} " if row.source_line else ""
    tokens = count_tokens(prefix + (row.token_text if row.token_text is not None else row.text))
    cur = await conn.execute(
        "INSERT INTO messages (session_id, seq, input_id, type, source_line, content_text,"
        " content, token_count, turn) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)"
        " ON CONFLICT DO NOTHING RETURNING seq",
        (row.session_id, row.seq, row.input_id, row.type.value, row.source_line, row.text,
         json.dumps(row.content) if row.content is not None else None, tokens, row.turn),
    )
    if await cur.fetchone() is not None:
        return Inserted(seq=row.seq, token_count=tokens)
    existing = await (await conn.execute(
        "SELECT seq, token_count FROM messages WHERE session_id=%s AND input_id=%s",
        (row.session_id, row.input_id),
    )).fetchone()
    if existing is None:
        # The seq is taken by a different input: the workflow never reuses a seq, so this
        # is a corrupted record, not something a retry can fix.
        raise RuntimeError(f"seq {row.seq} of {row.session_id} holds another input")
    return Inserted(seq=existing[0], token_count=existing[1], duplicate=True)


_ROW_COLUMNS = "seq, type, content_text AS text, source_line, content, token_count, turn"


def _to_row(r: dict[str, Any]) -> RecordRow:
    return RecordRow(
        seq=r["seq"], type=MessageType(r["type"]), text=r["text"], source_line=r["source_line"],
        content=r["content"], token_count=r["token_count"], turn=r["turn"],
    )


async def load_rows(
    conn: AsyncConnection, session_id: str, from_seq: int, upto_seq: int,
    types: list[MessageType] | None = None, limit: int | None = None,
) -> list[RecordRow]:
    """Rows with from_seq <= seq <= upto_seq, in order: the cost follows the range."""
    sql = f"SELECT {_ROW_COLUMNS} FROM messages WHERE session_id=%s AND seq BETWEEN %s AND %s"
    params: list[Any] = [session_id, from_seq, upto_seq]
    if types:
        sql += " AND type = ANY(%s)"
        params.append([t.value for t in types])
    sql += " ORDER BY seq"
    if limit:
        sql += " LIMIT %s"
        params.append(limit)
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql, params)
        return [_to_row(r) for r in await cur.fetchall()]


async def load_seqs(conn: AsyncConnection, session_id: str, seqs: list[int]) -> list[RecordRow]:
    if not seqs:
        return []
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"SELECT {_ROW_COLUMNS} FROM messages WHERE session_id=%s AND seq = ANY(%s)"
            " ORDER BY seq", (session_id, seqs))
        return [_to_row(r) for r in await cur.fetchall()]
