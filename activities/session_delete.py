"""A session taken out of the record's database: everything it owns, in one transaction.

Invariants:
- All of it or none of it: the session's rows (rewound ones too), checkpoints and their
  attempts, rewinds, interrupt marks, transcripts still queued for the vault, the requests
  that made it (a fork's or an import's), what was staged for its bundles, and its
  workspace (files, versions, op ids, the scope's total) go in one transaction, the
  session's own row last. Its row gone, a step of it still running cannot write a row or a
  checkpoint again (they reference it), so nothing it says after lands.
- Only what is the session's own goes: a fork of it, an import of its bundle, a sub-agent it
  delegated to are sessions of their own and keep everything; the shared workspace and the
  vault's long memory (scope-wide, kept in git) are untouched, and the result names the
  memory scope so the caller can say so.
- Run again, it deletes what is left (nothing, or what a step wrote meanwhile), so a
  caller may sweep twice.
"""

from __future__ import annotations

import psycopg
from psycopg import AsyncConnection
from pydantic import BaseModel

from activities.branch import LOCK_TIMEOUT

__all__ = ["RowsDeleted", "delete_rows", "delete_session_rows", "memory_scope_of"]

CONNECT_S = 10

# Each statement takes `s`, the session's id (its workspace's scope too). Ordered so that
# what references the session's row goes before it.
_DELETES: tuple[tuple[str, str], ...] = (
    ("rows", "DELETE FROM messages WHERE session_id = %(s)s"),
    ("checkpoints", "DELETE FROM checkpoints WHERE session_id = %(s)s"),
    ("attempts", "DELETE FROM checkpoint_attempts WHERE session_id = %(s)s"),
    ("rewinds", "DELETE FROM session_rewinds WHERE session_id = %(s)s"),
    ("interrupts", "DELETE FROM model_interrupts WHERE session_id = %(s)s"),
    ("transcripts", "DELETE FROM transcript_outbox WHERE session_id = %(s)s"),
    ("requests", "DELETE FROM branch_requests WHERE session_id = %(s)s"),
    ("staged", "DELETE FROM bundle_memory WHERE session_id = %(s)s"),
    ("files", "DELETE FROM workspace_files WHERE scope = %(s)s"),
    ("versions", "DELETE FROM workspace_file_versions WHERE scope = %(s)s"),
    ("writes", "DELETE FROM workspace_writes WHERE scope = %(s)s"),
    ("scope", "DELETE FROM workspace_scopes WHERE scope = %(s)s"),
    ("session", "DELETE FROM sessions WHERE session_id = %(s)s"),
)


class RowsDeleted(BaseModel):
    """What one deletion took out, by table (see `_DELETES`), and the memory scope the
    session's row named (its long memory, which stays)."""

    counts: dict[str, int]
    memory_scope: str | None = None

    @property
    def found(self) -> bool:
        return any(self.counts.values())

    def add(self, other: RowsDeleted) -> RowsDeleted:
        return RowsDeleted(counts={k: self.counts.get(k, 0) + other.counts.get(k, 0)
                                   for k in self.counts.keys() | other.counts.keys()},
                           memory_scope=self.memory_scope or other.memory_scope)


async def delete_session_rows(conn: AsyncConnection, session_id: str) -> RowsDeleted:
    """Everything `session_id` owns, deleted on `conn` inside the caller's transaction."""
    await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    # No tombstone versions for the files deleted (the workspace history trigger skips a
    # branch's own copies and this): their history goes with them.
    await conn.execute("SELECT set_config('keel.branch_copy', 'on', true)")
    found = await (await conn.execute(
        "SELECT memory_scope FROM sessions WHERE session_id = %s FOR UPDATE",
        (session_id,))).fetchone()
    counts: dict[str, int] = {}
    for name, sql in _DELETES:
        cur = await conn.execute(sql, {"s": session_id})
        counts[name] = max(cur.rowcount, 0)
    await conn.execute("SELECT set_config('keel.branch_copy', 'off', true)")
    return RowsDeleted(counts=counts, memory_scope=found[0] if found else None)


async def delete_rows(database_url: str, session_id: str) -> RowsDeleted:
    """`delete_session_rows` in a transaction of its own on a connection of its own."""
    async with await psycopg.AsyncConnection.connect(
            database_url, connect_timeout=CONNECT_S) as conn, conn.transaction():
        return await delete_session_rows(conn, session_id)


async def memory_scope_of(database_url: str, session_id: str) -> str | None:
    """The memory scope the session's row names (None: no row, or no long memory)."""
    async with await psycopg.AsyncConnection.connect(
            database_url, connect_timeout=CONNECT_S) as conn:
        found = await (await conn.execute(
            "SELECT memory_scope FROM sessions WHERE session_id = %s",
            (session_id,))).fetchone()
    return found[0] if found else None

