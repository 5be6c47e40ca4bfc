"""The conversation of record in PostgreSQL: idempotent inserts, fences and window loads.

Invariants: a row is inserted once (a retry with the same input id gets the row already
there); nothing PostgreSQL would change or refuse reaches an insert (`UnstorableData`, never
retried: the callers make text storable at the edge); and a seq the session gave up on is
fenced by a tombstone notice that overwrites whatever a late attempt wrote there and that
every later attempt collides with (`SeqAbandoned`), so "not recorded" stays true; and a
row a rewind marked abandoned is never loaded (`load_rows`, `load_seqs` skip it).
"""

from __future__ import annotations

import json
from typing import Any

from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import dict_row
from pydantic import BaseModel, Field
from temporalio.exceptions import ApplicationError

from schemas.attachments import CONTENT_WITHOUT_BYTES_SQL, Attachment
from schemas.input_size import InputLimits
from schemas.messages import REPLY_INLINE_CHARS, MessageType, RecordRow
from schemas.session import ReplyPart
from schemas.text import storable_json_problem, storable_problem
from schemas.tokens import count_tokens

FENCE_PREFIX = "fence-"  # the input id of a tombstone: never one a caller or Keel gives


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
    extra_tokens: int = 0  # counted beside the text: a message's attachments


class RecordInput(NewRow):
    """An input to record (the `record_input` activity, or a model call's record step)."""

    user_name: str = "user"  # for the session row, written with the first input
    # A background input's limits: over them it is recorded cut and kept whole in the
    # workspace (schemas.input_size); None for a user's message (refused over them).
    cut_over: InputLimits | None = None
    # A user's attached files, described (schemas.attachments): their bytes are read from
    # the workspace into the row when it is recorded (activities.attachments).
    attachments: list[Attachment] = Field(default_factory=list)


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


class FenceInput(BaseModel):
    session_id: str
    seq: int
    text: str  # what the record says in place of what was lost
    turn: int | None = None
    user_name: str = "user"


def unstorable(row: NewRow) -> str | None:
    """Why PostgreSQL cannot hold `row` exactly; None when it can."""
    for name, value in (("text", row.text), ("source line", row.source_line or ""),
                        ("input id", row.input_id), ("token text", row.token_text or "")):
        problem = storable_problem(value)
        if problem:
            return f"the {name}: {problem}"
    if row.content is not None:
        problem = storable_json_problem(row.content)
        if problem:
            return f"the content: {problem}"
    return None


async def insert_row(conn: AsyncConnection, row: NewRow) -> Inserted:
    """Insert once: a retry with the same input id returns the row already there."""
    return await (await send_insert(conn, row)).result()


class SentInsert:
    """An insert sent (in a pipeline, queued with what goes beside it); `result()` reads
    its outcome, and asks what a conflict means."""

    def __init__(self, conn: AsyncConnection, row: NewRow, cursor: AsyncCursor[Any],
                 tokens: int) -> None:
        self._conn, self._row, self._cursor, self._tokens = conn, row, cursor, tokens

    async def result(self) -> Inserted:
        if await self._cursor.fetchone() is not None:
            return Inserted(seq=self._row.seq, token_count=self._tokens)
        return await _already_there(self._conn, self._row)


async def send_insert(conn: AsyncConnection, row: NewRow) -> SentInsert:
    """The row's insert, once (ON CONFLICT DO NOTHING), sent; its outcome not read yet."""
    problem = unstorable(row)
    if problem:
        raise ApplicationError(f"seq {row.seq} cannot be stored: {problem}",
                               type="UnstorableData", non_retryable=True)
    prefix = f"{row.source_line} " if row.source_line else ""
    tokens = count_tokens(prefix + (row.token_text if row.token_text is not None else row.text))
    tokens += row.extra_tokens
    cur = await conn.execute(
        "INSERT INTO messages (session_id, seq, input_id, type, source_line, content_text,"
        " content, token_count, turn) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)"
        " ON CONFLICT DO NOTHING RETURNING seq",
        (row.session_id, row.seq, row.input_id, row.type.value, row.source_line, row.text,
         json.dumps(row.content) if row.content is not None else None, tokens, row.turn),
    )
    return SentInsert(conn, row, cur, tokens)


async def _already_there(conn: AsyncConnection, row: NewRow) -> Inserted:
    """An insert that found its seq or its input id taken: the same input (a retry), or
    an error no retry fixes."""
    existing = await (await conn.execute(
        # A rewound row's id is free again (migration 007): only a live row is this input.
        "SELECT seq, token_count FROM messages WHERE session_id=%s AND input_id=%s"
        " AND rewound_by IS NULL", (row.session_id, row.input_id),
    )).fetchone()
    if existing is None:
        # The seq is taken by a different input: the session gave up on it and fenced it
        # (a late attempt), or the record is corrupted. Neither is fixed by a retry.
        fenced = await (await conn.execute(
            "SELECT 1 FROM messages WHERE session_id=%s AND seq=%s AND input_id=%s",
            (row.session_id, row.seq, f"{FENCE_PREFIX}{row.seq}"))).fetchone()
        if fenced:
            raise ApplicationError(f"seq {row.seq} was given up on; this late attempt is "
                                   "refused", type="SeqAbandoned", non_retryable=True)
        raise ApplicationError(f"seq {row.seq} of {row.session_id} holds another input",
                               type="SeqAbandoned", non_retryable=True)
    return Inserted(seq=existing[0], token_count=existing[1], duplicate=True)


async def taken_tool_ids(conn: AsyncConnection, session_id: str,
                         blocks: list[dict[str, Any]]) -> set[str]:
    """Which of these tool_use blocks' ids a live call of the session has already: its
    result is recorded under `result-<id>` (one look-up in the live input-id index)."""
    ids = [b["id"] for b in blocks if b.get("type") == "tool_use" and isinstance(b.get("id"),
                                                                                str)]
    if not ids:
        return set()
    rows = await (await conn.execute(
        "SELECT input_id FROM messages WHERE session_id = %s AND input_id = ANY(%s)"
        " AND rewound_by IS NULL", (session_id, [f"result-{i}" for i in ids]))).fetchall()
    return {row[0].removeprefix("result-") for row in rows}


async def fence_seq(conn: AsyncConnection, fence: FenceInput) -> Inserted:
    """Write the tombstone notice at `fence.seq`, over anything a late attempt put there;
    the late attempt's own insert, if it comes after, collides with it."""
    await ensure_session(conn, fence.session_id, fence.user_name)
    tokens = count_tokens(fence.text)
    await conn.execute(
        "INSERT INTO messages (session_id, seq, input_id, type, source_line, content_text,"
        " content, token_count, turn) VALUES (%s,%s,%s,'notice',NULL,%s,NULL,%s,%s)"
        " ON CONFLICT (session_id, seq) DO UPDATE SET input_id=EXCLUDED.input_id,"
        " type='notice', source_line=NULL, content_text=EXCLUDED.content_text, content=NULL,"
        " token_count=EXCLUDED.token_count, turn=EXCLUDED.turn",
        (fence.session_id, fence.seq, f"{FENCE_PREFIX}{fence.seq}", fence.text, tokens,
         fence.turn))
    return Inserted(seq=fence.seq, token_count=tokens)


# A row a rewind abandoned (activities.branch) stays in the record but is never loaded
# into a window again.
LIVE = "rewound_by IS NULL"
# A row as a session's activities read it: a file's description, never its bytes (a
# request fetches those it sends: activities.attachments.with_bytes).
ROW_COLUMNS = ("seq, type, content_text AS text, source_line,"
               f" {CONTENT_WITHOUT_BYTES_SQL} AS content, token_count, turn")


def to_row(r: dict[str, Any]) -> RecordRow:
    return record_row(r["seq"], r["type"], r["text"], r["source_line"], r["content"],
                      r["token_count"], r["turn"])


def record_row(seq: int, kind: str, text: str, source_line: str | None, content: Any,
               token_count: int, turn: int | None) -> RecordRow:
    """A row from ROW_COLUMNS' values, in their order."""
    return RecordRow(seq=seq, type=MessageType(kind), text=text, source_line=source_line,
                     content=content, token_count=token_count, turn=turn)


async def load_rows(
    conn: AsyncConnection, session_id: str, from_seq: int, upto_seq: int,
    types: list[MessageType] | None = None, limit: int | None = None,
) -> list[RecordRow]:
    """Rows with from_seq <= seq <= upto_seq, in order: the cost follows the range."""
    sql = (f"SELECT {ROW_COLUMNS} FROM messages WHERE session_id=%s AND seq BETWEEN %s AND %s"
           f" AND {LIVE}")
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
        return [to_row(r) for r in await cur.fetchall()]


async def load_seqs(conn: AsyncConnection, session_id: str, seqs: list[int]) -> list[RecordRow]:
    return [row for _, row in await load_seqs_at(conn, session_id, seqs)]


async def load_seqs_at(conn: AsyncConnection, session_id: str, seqs: list[int],
                       ) -> list[tuple[int, RecordRow]]:
    """The live rows at `seqs`, in order, each with its revision (migration 010)."""
    if not seqs:
        return []
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            f"SELECT {ROW_COLUMNS}, rev FROM messages WHERE session_id=%s AND seq = ANY(%s)"
            f" AND {LIVE} ORDER BY seq", (session_id, seqs))
        return [(r["rev"], to_row(r)) for r in await cur.fetchall()]


async def reply_part(conn: AsyncConnection, session_id: str, seq: int,
                     start: int) -> ReplyPart:
    """At most REPLY_INLINE_CHARS of reply `seq`'s text from `start` (substring in SQL, so
    a long reply is never read whole); NoSuchReply when the seq is not a reply."""
    row = await (await conn.execute(
        "SELECT substr(content_text, %s, %s), char_length(content_text) FROM messages"
        " WHERE session_id=%s AND seq=%s AND type=%s",
        (start + 1, REPLY_INLINE_CHARS, session_id, seq, MessageType.ASSISTANT.value),
    )).fetchone()
    if row is None:
        raise ApplicationError(f"message #{seq} is not a reply of session {session_id!r}",
                               type="NoSuchReply", non_retryable=True)
    return ReplyPart(text=row[0] or "", start=start, total_chars=row[1] or 0)
