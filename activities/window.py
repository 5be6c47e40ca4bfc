"""The live window a request is built over, loaded from the record.

A window is the checkpoint's rendered text (when there is one), the rows it carried that
lie before the window's start, and every row from the start up to `upto`, in order; with
the system prompt of the session as its row says it now. Every load reads the session's
memory scope from its row first and tells the prompt (`SessionPrompt.remember_scope`), so
a prompt or tool list built after a load carries that scope's core memory and tools.
"""

from __future__ import annotations

from psycopg import AsyncConnection
from pydantic import BaseModel
from temporalio.exceptions import ApplicationError

from activities.prompt import SessionPrompt
from activities.record import load_rows, load_seqs
from schemas.messages import RecordRow

__all__ = ["LoadedWindow", "WindowLoader"]


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
        carried: list[RecordRow] = []
        if checkpoint_id:
            found = await (await conn.execute(
                "SELECT rendered, carried_seqs FROM checkpoints WHERE checkpoint_id=%s",
                (checkpoint_id,))).fetchone()
            if found is None:
                raise ApplicationError(f"checkpoint {checkpoint_id} missing", non_retryable=True)
            checkpoint_text = found[0]
            carried = await load_seqs(conn, session_id,
                                      [s for s in found[1] if s < window_start])
        return carried + await load_rows(conn, session_id, window_start, upto), checkpoint_text
