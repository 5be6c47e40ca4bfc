"""Forgetting one card on the vault's side (the rules: schemas.vault.forget): the vault
queue's activity that deletes the card's file and index rows and writes its tombstone.

Invariants:
- It runs on the vault's own queue under the scope's lock (the vault's one writer), so no
  rollup, flush or write_card of the scope writes the card between its deletion and its
  tombstone.
- The tombstone and the index rows change in one transaction, before the file goes: a
  step cut short leaves a file the retry deletes, never a card found by search whose file
  is gone or a card deleted that the next rollup writes again.
- Run again, it finds no card and says so; the tombstone stays, dated anew.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime

from temporalio import activity

from activities.heartbeat import with_heartbeat
from activities.vault.context import MemoryContext, scope_vaults
from activities.vault.files import read_text
from activities.vault.search import delete_documents
from activities.vault.store import Vault
from schemas.vault.card import card_filename, link_key, parse_card
from schemas.vault.forget import CardForgotten, ForgetCardInput
from schemas.vault.schema import CARDS_DIR, CORE_FILE
from schemas.vault.scope import KNOWN_SCOPES_SQL

__all__ = ["ForgetCardActivities"]


def _card(vault: Vault, asked: str) -> tuple[str | None, str]:
    """The card's vault path (None: no such card) and its title, by a title or a path."""
    if asked.startswith(f"{CARDS_DIR}/") and asked.endswith(".md"):
        rel = asked if asked in vault.card_files() else None  # never a climb out of cards/
    else:
        rel = vault.find_card(asked)
    if rel is None:
        return None, asked
    with contextlib.suppress(Exception):  # a card a person broke: named by its file
        title = parse_card(read_text(vault.path(rel)).text).title
        if title:
            return rel, title
    return rel, rel.rsplit("/", 1)[-1].removesuffix(".md")


def _like(text: str) -> str:
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class ForgetCardActivities:
    """A card's forgetting, over the vault worker's memory context."""

    def __init__(self, ctx: MemoryContext) -> None:
        self.ctx = ctx

    async def _unknown_scope(self, ctx: MemoryContext, card: str) -> CardForgotten | None:
        """The answer for a scope the deployment does not know (no vault folder here, and
        PostgreSQL names it nowhere), else None: a scope with sessions and no vault yet
        keeps its tombstone, for the rollup that will write its first cards."""
        async with ctx.connection() as conn:
            known = {s for (s,) in await (await conn.execute(KNOWN_SCOPES_SQL)).fetchall()}
        if ctx.scope in known:
            return None
        known |= set(scope_vaults(self.ctx.settings.memory))
        return CardForgotten(scope=ctx.scope, title=card, scope_known=False,
                             scopes=sorted(known))

    @activity.defn(name="forget_memory_card")
    async def forget_memory_card(self, data: ForgetCardInput) -> CardForgotten:
        return await with_heartbeat(self._forget(data))

    async def _forget(self, data: ForgetCardInput) -> CardForgotten:
        ctx = self.ctx.scoped(data.scope)
        vault = ctx.vault
        if not vault.root.is_dir():  # asked before the lock, which makes the folder
            unknown = await self._unknown_scope(ctx, data.card.strip())
            if unknown is not None:
                return unknown
        async with vault.lock(), ctx.connection() as conn:
            rel, title = await asyncio.to_thread(_card, vault, data.card.strip())
            day = vault.local_date(datetime.now(UTC))
            done = CardForgotten(scope=ctx.scope, title=title, path=rel, forgotten_on=day)
            key = link_key(rel if rel is not None else card_filename(title))
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO memory_forgotten (scope, card_key, title, forgotten_on)"
                    " VALUES (%s, %s, %s, %s) ON CONFLICT (scope, card_key) DO UPDATE SET"
                    " title = EXCLUDED.title, forgotten_on = EXCLUDED.forgotten_on,"
                    " forgotten_at = now()", (ctx.scope, key, title, day))
                if rel is not None:
                    done.documents = await delete_documents(conn, [rel], scope=ctx.scope)
            if rel is not None:
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(vault.path(rel).unlink)
            for kind, field in (("daily", "daily_mentions"), ("summary", "summary_mentions"),
                                ("card", "card_mentions")):
                row = await (await conn.execute(
                    "SELECT count(*) FROM memory_docs WHERE scope = %s AND kind = %s AND"
                    " body ILIKE %s", (ctx.scope, kind, _like(title)))).fetchone()
                setattr(done, field, row[0] if row else 0)
            core = vault.path(CORE_FILE)
            done.in_core = core.is_file() and title.casefold() in read_text(
                core).text.casefold()
        return done
