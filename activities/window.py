"""The live window a request is built over, loaded from the record.

A window is the checkpoint's rendered text (when there is one), the rows it carried that
lie before the window's start, and every row from the start up to `upto`, in order; with
the system prompt of the session as its row says it now. Every load reads the session's
memory scope from its row first and tells the prompt (`SessionPrompt.remember_scope`), so
a prompt or tool list built after a load carries that scope's core memory and tools.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import dict_row
from pydantic import BaseModel
from temporalio.exceptions import ApplicationError

from activities.prompt import SessionPrompt
from activities.record import LIVE, ROW_COLUMNS, to_row
from schemas.messages import RecordRow

__all__ = ["LoadedWindow", "PendingRows", "WindowLoader", "window_rows"]

# A window's rows: from its start up to `upto`, and before its start the rows its
# checkpoint carried (this turn's own messages, kept verbatim); plus one more seq a caller
# asks about (`also`: a model call's reply, which a retry finds recorded).
_WINDOW_ROWS = (
    f"SELECT {ROW_COLUMNS} FROM messages WHERE session_id = %(sid)s AND {LIVE}"
    " AND (seq BETWEEN %(start)s AND %(upto)s OR seq = %(also)s"
    " OR (seq < %(start)s AND seq IN (SELECT jsonb_array_elements_text(carried_seqs)::bigint"
    " FROM checkpoints WHERE checkpoint_id = %(cp)s))) ORDER BY seq")


class PendingRows:
    """A window's rows asked for (in a pipeline, sent with what goes beside them)."""

    def __init__(self, cursor: AsyncCursor[dict[str, Any]]) -> None:
        self._cursor = cursor

    async def fetch(self) -> list[RecordRow]:
        return [to_row(r) for r in await self._cursor.fetchall()]


async def window_rows(conn: AsyncConnection, session_id: str, window_start: int, upto: int,
                      checkpoint_id: str | None, also: int | None = None) -> PendingRows:
    """Ask for a window's rows in order, the checkpoint's carried ones first: one
    statement, whose cost follows the window, not the record."""
    cursor = conn.cursor(row_factory=dict_row)
    await cursor.execute(_WINDOW_ROWS, {"sid": session_id, "start": window_start,
                                        "upto": upto, "also": also, "cp": checkpoint_id})
    return PendingRows(cursor)


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
                   upto: int, checkpoint_id: str | None,
                   instructions: str = "") -> LoadedWindow:
        await self.session_scope(conn, session_id)
        rows, checkpoint_text = await self.rows(conn, session_id, window_start, upto,
                                                checkpoint_id)
        return LoadedWindow(system=await self._prompt.system_prompt(session_id, instructions),
                            rows=rows, checkpoint_text=checkpoint_text)

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
