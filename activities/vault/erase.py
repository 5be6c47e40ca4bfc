"""Erasing a memory scope on the vault's side (the rules: schemas.vault.erase): the vault
queue's one activity that deletes the scope's rows and then its folder.

Invariants:
- It runs on the vault's own queue under the scope's lock, so no transcript, card, rollup
  or doctor step of the scope runs beside it.
- The rows go first, in one transaction (a crash leaves all of them or none), then the
  folder, then the copies of its CORE.md and schema.json published for the session
  workers (activities.vault_share): a step cut short leaves what no search finds, and
  the retry takes it; never an index pointing at words whose files are gone.
- `SCOPE_TABLES` is every table of long memory with a `scope` column (a test lists them
  from the database, so a later table cannot be missed); the workspace tables, whose
  `scope` is a session's id, are not among them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

from temporalio import activity

from activities.heartbeat import with_heartbeat
from activities.vault.context import MemoryContext
from activities.vault_share import unpublish_scope
from activities.workspace import open_store
from schemas.vault.erase import EraseScopeInput, ScopeErased

__all__ = ["SCOPE_TABLES", "ScopeEraseActivities"]

# In this order: the documents first (their chunks go with them, ON DELETE CASCADE, and
# their statement triggers update the term statistics, which then go too).
SCOPE_TABLES = ("memory_docs", "memory_links", "memory_terms", "memory_stats",
                "memory_languages", "vault_ops", "rollup_plans", "rollup_runs",
                "transcript_outbox", "bundle_memory", "memory_forgotten")


def _count_files(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


class ScopeEraseActivities:
    """A scope's erasure, over the vault worker's memory context."""

    def __init__(self, ctx: MemoryContext) -> None:
        self.ctx = ctx

    @activity.defn(name="erase_memory_scope")
    async def erase_memory_scope(self, data: EraseScopeInput) -> ScopeErased:
        return await with_heartbeat(self._erase(data))

    async def _erase(self, data: EraseScopeInput) -> ScopeErased:
        ctx = self.ctx.scoped(data.scope)
        root = ctx.vault.root
        # Looked at before the lock, which makes the folder to hold its lock file.
        had_folder = not ctx.vault.holds_nothing()
        done = ScopeErased(scope=ctx.scope)
        async with ctx.vault.lock(), ctx.connection() as conn:
            async with conn.transaction():
                for table in SCOPE_TABLES:
                    cur = await conn.execute(f"DELETE FROM {table} WHERE scope = %s",
                                             (ctx.scope,))
                    if cur.rowcount > 0:
                        done.rows[table] = cur.rowcount
            if had_folder:
                done.folder, done.files = str(root), await asyncio.to_thread(_count_files,
                                                                             root)
            # The lock's file goes with the folder; the lock is held on it until the end.
            await asyncio.to_thread(shutil.rmtree, root)
            # Then the copies the session workers read CORE.md from: with no folder left,
            # the beat publishes none again.
            done.copies = await unpublish_scope(
                open_store(ctx.settings, ctx.database_url), ctx.scope)
        return done
