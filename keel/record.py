"""Reading the conversation of record and its checkpoints, for people: the CLI and the UI.

One query for each view, used by both readers: `keel record` (sync psycopg) and the web UI
(async psycopg) call the same SQL built here, so the two can never show different rows.
Every database read of the command line goes through here (`keel vault search` too), but
for a session's bundle, which `keel export` reads and `keel import` writes whole in one
place (activities.bundle): no command holds SQL.

Invariants: every read is bounded (a page of at most `MAX_PAGE` rows, chosen by seq on the
(session_id, seq) key, so its cost follows the page, not the record; a message's files come
described, never their bytes); nothing here writes. Texts are returned as stored; escaping
is the renderer's job (rich markup, HTML).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from schemas.attachments import CONTENT_WITHOUT_BYTES_SQL, attachments_of, with_lines
from schemas.vault.scope import KNOWN_SCOPES_SQL

if TYPE_CHECKING:
    from activities.vault.search import MemoryDoc
    from schemas.vault.recall import SearchHits

MAX_PAGE = 1_000


@dataclass(frozen=True)
class RecordEntry:
    """One row of the record as a person reads it."""

    seq: int
    type: str
    source_line: str | None
    text: str
    token_count: int
    turn: int | None = None
    content: Any = None
    created_at: datetime | None = None
    # Branching (activities.branch): the rewind that abandoned the row, where a fork copied
    # it from.
    rewound_by: str | None = None
    origin_session: str | None = None
    origin_seq: int | None = None

    @property
    def files(self) -> list[dict[str, Any]]:
        """The files a user's message carried, described (their bytes are not read)."""
        return attachments_of(self.content)

    @property
    def shown_text(self) -> str:
        """The text, a message's files named below it by their lines."""
        return with_lines(self.text, self.files)


_RECORD_SQL = (
    "SELECT seq, type, source_line, content_text AS text, token_count, turn,"
    f" {CONTENT_WITHOUT_BYTES_SQL} AS content,"
    " created_at, rewound_by, origin_session, origin_seq FROM messages"
    " WHERE session_id = %(session)s AND seq >= %(from_seq)s"
    " AND (NOT %(user)s OR type = 'user')"
    " ORDER BY seq LIMIT %(limit)s")


def _record_params(session_id: str, from_seq: int, user_only: bool, limit: int
                   ) -> dict[str, Any]:
    return {"session": session_id, "from_seq": from_seq, "user": user_only,
            "limit": max(1, min(limit, MAX_PAGE))}


def read_record(conn: psycopg.Connection[Any], session_id: str, *, from_seq: int = 1,
                user_only: bool = False, limit: int = 200) -> list[RecordEntry]:
    """A page of the record from `from_seq` on (the user's own messages only, if asked)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(_RECORD_SQL, _record_params(session_id, from_seq, user_only,
                                                       limit)).fetchall()
    return [RecordEntry(**r) for r in rows]


async def read_record_async(conn: psycopg.AsyncConnection[Any], session_id: str, *,
                            from_seq: int = 1, user_only: bool = False, limit: int = 200,
                            ) -> list[RecordEntry]:
    """`read_record` over an async connection: the same query."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(_RECORD_SQL, _record_params(session_id, from_seq, user_only, limit))
        rows = await cur.fetchall()
    return [RecordEntry(**r) for r in rows]


async def record_extent(conn: psycopg.AsyncConnection[Any], session_id: str
                        ) -> tuple[int, int]:
    """(messages, last seq) of a session's record: an index-only count."""
    cur = await conn.execute(
        "SELECT count(*), coalesce(max(seq), 0) FROM messages WHERE session_id = %s",
        (session_id,))
    row = await cur.fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


_FILE_SQL = ("SELECT content->'attachments'->%s FROM messages"
             " WHERE session_id = %s AND seq = %s AND jsonb_typeof(content->'attachments')"
             " = 'array'")


async def read_file_of(conn: psycopg.AsyncConnection[Any], session_id: str, seq: int,
                       index: int) -> tuple[dict[str, Any], bytes] | None:
    """File `index` of the message at `seq` (a user's attachment, a tool's image): its
    description and its bytes, the only read of them here; None when there is none (a
    seq or an index past what PostgreSQL's bigint and int hold is none: a URL's number
    may be any length, and a negative index would count from the end)."""
    if not (0 <= index < 2**31 and 0 <= seq < 2**63):
        return None
    row = await (await conn.execute(_FILE_SQL, (index, session_id, seq))).fetchone()
    item = row[0] if row else None
    if not isinstance(item, dict) or not isinstance(item.get("data"), str):
        return None
    data = base64.b64decode(item.pop("data"))
    return item, data


_SESSION_SQL = "SELECT 1 FROM sessions WHERE session_id = %s"


def session_in_record(conn: psycopg.Connection[Any], session_id: str) -> bool:
    """Whether the record knows the session (its row in `sessions`); `session_exists` over
    an async connection."""
    return conn.execute(_SESSION_SQL, (session_id,)).fetchone() is not None


def read_session_page(database_url: str, session_id: str, *, from_seq: int = 1,
                      user_only: bool = False, limit: int = 200) -> list[RecordEntry] | None:
    """`read_record` on a connection of its own (`keel record`); None when the record knows
    no such session."""
    with psycopg.connect(database_url) as conn:
        known = session_in_record(conn, session_id)
        rows = read_record(conn, session_id, from_seq=from_seq, user_only=user_only,
                           limit=limit)
    return rows if known else None


async def search_memory(database_url: str, query: str, *, scope: str, k: int
                        ) -> SearchHits:
    """The `k` best hits for `query` in one scope's long memory (`keel vault search`): the
    vault's own search (BM25 + graph rerank) on a connection of its own."""
    from activities.vault.search import search  # the vault's search loads only here

    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        return await search(conn, query, scope=scope, k=k)


async def read_memory(database_url: str, path: str, *, scope: str) -> MemoryDoc | None:
    """One document of a scope's long memory whole, as memory_get reads it (`keel vault
    show`); None when there is none."""
    from activities.vault.search import read_document  # the vault's reads load only here

    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        return await read_document(conn, path, scope=scope)


@dataclass(frozen=True)
class TranscriptBacklog:
    """A scope's daily-transcript entries queued for the vault worker (the transcript
    outbox, activities.vault.outbox): how many, how many failed and wait their retry, and
    the newest error."""

    scope: str
    queued: int
    retrying: int
    last_error: str | None


_BACKLOG_SQL = (
    "SELECT scope, count(*), count(*) FILTER (WHERE attempts > 0),"
    " (array_agg(last_error ORDER BY id DESC) FILTER (WHERE last_error IS NOT NULL))[1]"
    " FROM transcript_outbox GROUP BY scope ORDER BY scope")


def transcript_backlog(database_url: str) -> list[TranscriptBacklog]:
    """Every scope with transcripts still queued for the vault worker (`keel vault list`):
    a count per scope, whatever the queue's length."""
    with psycopg.connect(database_url) as conn:
        return [TranscriptBacklog(scope, queued, retrying, error)
                for scope, queued, retrying, error in conn.execute(_BACKLOG_SQL)]


def known_scopes(database_url: str) -> set[str]:
    """Every scope PostgreSQL knows of (schemas.vault.scope.KNOWN_SCOPES_SQL)."""
    with psycopg.connect(database_url) as conn:
        return {scope for (scope,) in conn.execute(KNOWN_SCOPES_SQL)}


def indexed_scopes(database_url: str) -> dict[str, int]:
    """Every scope the search index holds, with its documents (`keel vault list`): what
    every host sees, where a vault's folder is on the vault worker's host only."""
    with psycopg.connect(database_url) as conn:
        return {scope: int(docs) for scope, docs in conn.execute(
            "SELECT scope, n_docs FROM memory_stats WHERE n_docs > 0 ORDER BY scope")}


# ----- checkpoints ------------------------------------------------------------------------

class CheckpointKindShown(StrEnum):
    FULL = "full"
    EARLIER_PART = "earlier part"
    MOVED = "moved without the model"


@dataclass(frozen=True)
class MemoEntry:
    seq: int
    text: str
    cut: bool = False


@dataclass(frozen=True)
class CheckpointEntry:
    """One stored checkpoint, with what its attempt needed (repair, problems)."""

    number: int  # 1 for the session's first checkpoint
    checkpoint_id: str
    kind: CheckpointKindShown
    created_at: datetime
    record_seq: int
    cut_seq: int
    upto_seq: int
    tokens_before: int
    tokens_after: int
    tokens_moved_out: int
    fallbacks: list[str]
    repair_sent: bool
    problems: list[Any]
    mind_text: str = ""
    now_text: str = ""
    memo: list[MemoEntry] = field(default_factory=list)
    memo_dropped_seqs: list[int] = field(default_factory=list)


# The attempt that made a checkpoint: its id is "ckpt:" + the attempt id
# (activities.checkpoint.checkpoint_id_for); its first round holds the attempt's input,
# whose `portion` below 1 means only the earlier part was condensed.
_CHECKPOINTS_SQL = (
    "SELECT c.checkpoint_id, c.kind, c.created_at, c.record_seq, c.cut_seq, c.upto_seq,"
    " c.window_tokens_before, c.window_tokens_after, c.tokens_moved_out, c.fallbacks,"
    " c.memo_dropped_seqs, {texts}"
    " coalesce(a.repair_sent, false) AS repair_sent, coalesce(a.problems, '[]') AS problems,"
    " (a.rounds -> 0 -> 'meta' ->> 'portion')::float AS portion"
    " FROM checkpoints c LEFT JOIN checkpoint_attempts a"
    " ON c.checkpoint_id = 'ckpt:' || a.attempt_id"
    " WHERE c.session_id = %s ORDER BY c.created_at, c.record_seq")


def _kind(kind: str, portion: float | None) -> CheckpointKindShown:
    if kind == "move_half":
        return CheckpointKindShown.MOVED
    if portion is not None and portion < 1.0:
        return CheckpointKindShown.EARLIER_PART
    return CheckpointKindShown.FULL


async def read_checkpoints(conn: psycopg.AsyncConnection[Any], session_id: str, *,
                           texts: bool = True) -> list[CheckpointEntry]:
    """Every stored checkpoint of a session, oldest first (each bounded by its budgets)."""
    columns = "c.mind_text, c.now_text, c.memo," if texts else ""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(_CHECKPOINTS_SQL.format(texts=columns), (session_id,))
        rows = await cur.fetchall()
    out = []
    for n, r in enumerate(rows, 1):
        out.append(CheckpointEntry(
            number=n, checkpoint_id=r["checkpoint_id"], kind=_kind(r["kind"], r["portion"]),
            created_at=r["created_at"], record_seq=r["record_seq"], cut_seq=r["cut_seq"],
            upto_seq=r["upto_seq"], tokens_before=r["window_tokens_before"],
            tokens_after=r["window_tokens_after"], tokens_moved_out=r["tokens_moved_out"],
            fallbacks=list(r["fallbacks"] or []), repair_sent=bool(r["repair_sent"]),
            problems=list(r["problems"] or []),
            mind_text=r.get("mind_text") or "", now_text=r.get("now_text") or "",
            memo=[MemoEntry(seq=int(m["seq"]), text=str(m.get("text", "")),
                            cut=bool(m.get("cut", False))) for m in (r.get("memo") or [])],
            memo_dropped_seqs=list(r["memo_dropped_seqs"] or [])))
    return out


async def known_sessions(conn: psycopg.AsyncConnection[Any], limit: int = 500
                         ) -> list[tuple[str, datetime, datetime | None, int]]:
    """(session id, created, last message at, checkpoints) of the sessions in the record,
    newest first."""
    cur = await conn.execute(
        "SELECT s.session_id, s.created_at,"
        " (SELECT max(m.created_at) FROM messages m WHERE m.session_id = s.session_id"
        "   AND m.seq = (SELECT max(seq) FROM messages WHERE session_id = s.session_id)),"
        " (SELECT count(*) FROM checkpoints c WHERE c.session_id = s.session_id)"
        " FROM sessions s ORDER BY s.created_at DESC LIMIT %s", (limit,))
    return [(r[0], r[1], r[2], int(r[3])) for r in await cur.fetchall()]


# ----- readers for the web UI -------------------------------------------------------------

@dataclass(frozen=True)
class SessionOrigin:
    """Where a session came from: a fork of another at a seq, or an import."""

    session_id: str
    seq: int | None
    kind: str


async def session_origin(conn: psycopg.AsyncConnection[Any], session_id: str
                         ) -> SessionOrigin | None:
    cur = await conn.execute(
        "SELECT origin_session, origin_seq, origin_kind FROM sessions WHERE session_id = %s"
        " AND origin_session IS NOT NULL", (session_id,))
    row = await cur.fetchone()
    return SessionOrigin(row[0], row[1], row[2] or "fork") if row else None


async def session_scope(conn: psycopg.AsyncConnection[Any], session_id: str) -> str | None:
    """The memory scope the session's row names (from its first model call on; None: not
    yet, or no long memory)."""
    cur = await conn.execute("SELECT memory_scope FROM sessions WHERE session_id = %s",
                             (session_id,))
    row = await cur.fetchone()
    return row[0] if row else None


CONNECT_S = 10  # an erasure's reads of the sessions' scopes wait this long for the server


async def scope_sessions(database_url: str, scope: str) -> list[str]:
    """Every session whose row names `scope` as its memory scope, by id (a row says its
    scope from the session's first model call on: activities.model_call)."""
    async with await psycopg.AsyncConnection.connect(
            database_url, connect_timeout=CONNECT_S) as conn:
        found = await (await conn.execute(
            "SELECT session_id FROM sessions WHERE memory_scope = %s ORDER BY session_id",
            (scope,))).fetchall()
    return [sid for (sid,) in found]


async def session_scopes(database_url: str, session_ids: list[str]) -> dict[str, str | None]:
    """The memory scope each of `session_ids` has on its row (None: none yet, or no long
    memory); an id without a row is left out."""
    async with await psycopg.AsyncConnection.connect(
            database_url, connect_timeout=CONNECT_S) as conn:
        found = await (await conn.execute(
            "SELECT session_id, memory_scope FROM sessions WHERE session_id = ANY(%s)",
            (session_ids,))).fetchall()
    return dict(found)


async def session_exists(conn: psycopg.AsyncConnection[Any], session_id: str) -> bool:
    """Whether the record has a row for the session (a page is not a 404 when it does)."""
    cur = await conn.execute(_SESSION_SQL, (session_id,))
    return await cur.fetchone() is not None
