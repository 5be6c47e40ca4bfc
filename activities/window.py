"""The live window a request is built over, loaded from the record.

A window is the checkpoint's rendered text (when there is one), the rows it carried that
lie before the window's start, and every row from the start up to `upto`, in order; with
the system prompt of the session as its row says it now. Every load reads the session's
memory scope from its row first and tells the prompt (`SessionPrompt.remember_scope`), so
a prompt or tool list built after a load carries that scope's core memory and tools.
"""

from __future__ import annotations

import weakref
from typing import Any

from psycopg import AsyncConnection, AsyncCursor
from pydantic import BaseModel
from temporalio.exceptions import ApplicationError

from activities.prompt import SessionPrompt
from activities.record import LIVE, load_seqs_at, record_row
from activities.row_cache import HeldRows, Key, row_cache
from schemas.attachments import CONTENT_WITHOUT_BYTES_SQL
from schemas.messages import RecordRow

__all__ = ["LoadedWindow", "PendingRows", "WindowLoader", "server_of", "window_rows"]

# A window's rows: from its start up to `upto`, and before its start the rows its
# checkpoint carried (this turn's own messages, kept verbatim); plus one more seq a caller
# asks about (`also`: a model call's reply, which a retry finds recorded). Every row comes
# with its revision; its columns only when the revision is above the newest this worker
# holds of the session (activities.row_cache): the others it holds already, or reads next.
_FRESH = "rev > %(known)s"
# A file's bytes are not a window's: a request fetches those it sends
# (activities.attachments.with_bytes), so a window of a hundred screenshots reads their
# descriptions, and this worker holds them.
_COLUMNS = ", ".join(f"CASE WHEN {_FRESH} THEN {column} END AS {name}" for column, name in (
    ("type", "type"), ("content_text", "text"), ("source_line", "source_line"),
    (CONTENT_WITHOUT_BYTES_SQL, "content"), ("token_count", "token_count"), ("turn", "turn")))
_WINDOW_ROWS = (
    f"SELECT seq, rev, {_COLUMNS} FROM messages WHERE session_id = %(sid)s AND {LIVE}"
    " AND (seq BETWEEN %(start)s AND %(upto)s OR seq = %(also)s"
    " OR (seq < %(start)s AND seq IN (SELECT jsonb_array_elements_text(carried_seqs)::bigint"
    " FROM checkpoints WHERE checkpoint_id = %(cp)s))) ORDER BY seq")


# Each connection's server, as the row cache names it: the database and when its server
# started. A server that restarted or took over after a failover may have lost the newest
# writes, and with them revisions it hands out again, so what a worker holds from another
# run of the server is never taken for this one's. Asked once per connection.
# Never an error (it is asked in the caller's pipeline, beside an input's insert): a role
# that may not call the function (a privilege is checked when a statement starts, whether
# or not the call is reached) does not, and its rows are held per database alone.
_MAY_ASK = "SELECT has_function_privilege('pg_postmaster_start_time()', 'execute')"
_SERVER_STARTED = "SELECT pg_postmaster_start_time()::text"
SERVERS: weakref.WeakKeyDictionary[AsyncConnection, str] = weakref.WeakKeyDictionary()


async def server_of(conn: AsyncConnection) -> str:
    found = SERVERS.get(conn)
    if found is None:
        may = await (await conn.execute(_MAY_ASK)).fetchone()
        row = (await (await conn.execute(_SERVER_STARTED)).fetchone()
               if may and may[0] else None)
        info = conn.info
        found = SERVERS[conn] = f"{info.host}:{info.port}/{info.dbname}@{row[0] if row else ''}"
    return found


class PendingRows:
    """A window's rows asked for (in a pipeline, sent with what goes beside them)."""

    def __init__(self, conn: AsyncConnection, cursor: AsyncCursor[tuple[Any, ...]],
                 key: Key, held: HeldRows) -> None:
        self._conn = conn
        self._cursor = cursor
        self._key = key
        self._held = held

    async def fetch(self) -> list[RecordRow]:
        held = self._held.get
        kept: list[tuple[int, RecordRow]] = []  # (rev, row), in the window's order (seq)
        missing: list[int] = []
        # (seq, rev, then the row's columns: all None when not sent)
        for seq, rev, kind, text, source_line, content, tokens, turn in (
                await self._cursor.fetchall()):
            row = (held(seq, rev) if kind is None else
                   record_row(seq, kind, text, source_line, content, tokens, turn))
            if row is None:
                missing.append(seq)
            else:
                kept.append((rev, row))
        # Rare: rows named at a revision this worker does not hold (written by another
        # worker below the newest revision seen here, or evicted): read whole, as they are
        # now, and put in their places.
        if missing:
            whole = await load_seqs_at(self._conn, self._key[1], missing)
            kept = sorted(kept + whole, key=lambda e: e[1].seq)
        row_cache.keep(self._key, kept)
        return [row for _, row in kept]


async def window_rows(conn: AsyncConnection, session_id: str, window_start: int, upto: int,
                      checkpoint_id: str | None, also: int | None = None) -> PendingRows:
    """Ask for a window's rows in order, the checkpoint's carried ones first: one
    statement, whose cost follows the window, not the record; the rows this worker holds
    at the revision the record names are not sent again, nor decoded (activities.row_cache)."""
    key = (await server_of(conn), session_id)
    held = row_cache.held(key)
    cursor = conn.cursor()
    await cursor.execute(_WINDOW_ROWS, {"sid": session_id, "start": window_start,
                                        "upto": upto, "also": also, "cp": checkpoint_id,
                                        "known": held.newest_rev})
    return PendingRows(conn, cursor, key, held)


class LoadedWindow(BaseModel):
    system: str
    rows: list[RecordRow]
    checkpoint_text: str | None = None


class WindowLoader:
    """Loads windows from the record; the system prompt from `prompt`."""

    def __init__(self, prompt: SessionPrompt) -> None:
        self._prompt = prompt

    async def session_scope(self, conn: AsyncConnection, session_id: str) -> str | None:
        row = await (await conn.execute(
            "SELECT memory_scope FROM sessions WHERE session_id = %s", (session_id,))
        ).fetchone()
        scope: str | None = row[0] if row else None
        self._prompt.remember_scope(session_id, scope)
        return scope

    async def load(self, conn: AsyncConnection, session_id: str, window_start: int,
                   upto: int, checkpoint_id: str | None, instructions: str = "", *,
                   hard_limit: int | None = None) -> LoadedWindow:
        await self.session_scope(conn, session_id)
        rows, checkpoint_text = await self.rows(conn, session_id, window_start, upto,
                                                checkpoint_id)
        system = await self._prompt.system_prompt(session_id, instructions,
                                                  hard_limit=hard_limit)
        return LoadedWindow(system=system, rows=rows, checkpoint_text=checkpoint_text)

    async def rows(self, conn: AsyncConnection, session_id: str, window_start: int,
                   upto: int, checkpoint_id: str | None,
                   ) -> tuple[list[RecordRow], str | None]:
        """The window's rows and the checkpoint's text, without the system prompt (for a
        caller that reads the scope and the prompt's files itself)."""
        checkpoint_text: str | None = None
        if checkpoint_id:
            found = await (await conn.execute(
                "SELECT rendered FROM checkpoints WHERE checkpoint_id=%s",
                (checkpoint_id,))).fetchone()
            if found is None:
                raise ApplicationError(f"checkpoint {checkpoint_id} missing", non_retryable=True)
            checkpoint_text = found[0]
        rows = await window_rows(conn, session_id, window_start, upto, checkpoint_id)
        return await rows.fetch(), checkpoint_text
