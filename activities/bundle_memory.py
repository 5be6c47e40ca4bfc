"""A bundle's long memory on the vault's side: the vault queue's activities that read a
session's cards and daily-note entries for an export, and write an import's (the lines
and their rules: schemas.bundle_memory).

Invariants:
- Only these activities touch the vault's files for a bundle, on the vault's own queue
  (one writer), under the vault's lock; the export and the import meet them in the
  `bundle_memory` table (migration 007), never in a payload (a session's entries can be
  megabytes).
- The export's staging replaces whatever an earlier attempt of the same request staged,
  so a retry stages the same rows once.
- The import's write checks every card first: one in the way (a file at its path with
  other text) and nothing at all is written; the staged rows stay for the caller, who
  undoes the import. A card a person had the scope forget (`memory_forgotten`) is never
  written back: left out, and named in the result. Otherwise the cards are written,
  indexed and marked `written`, then every daily file's entries are appended, indexed in
  one bulk load and marked, so a retry after a crash writes only what is missing (a card
  with the same text is no conflict, an entry already there by its marker is not appended
  again), and the staged rows are deleted once all are written. The session's ops are
  recorded in `vault_ops` as applied, so an export from this vault finds its cards.
- Forgetting a session (its deletion) takes its entries out of the daily files its index
  rows name, each file rewritten whole with the rest byte for byte, then its entries'
  index rows, its card ops and its flush plans (whose ids name it); run again, it finds
  nothing more. Its cards stay: they are the scope's knowledge, which other sessions'
  turns read and edit. The originals of its messages' files go with its entries
  (activities.vault.originals), and an import writes those its entries link from the
  imported record before the entries.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from psycopg import AsyncConnection
from temporalio import activity

from activities.heartbeat import with_heartbeat
from activities.vault.bulk import index_bulk
from activities.vault.context import MemoryContext
from activities.vault.files import atomic_write, read_text
from activities.vault.forgotten import forget_entries, forgotten_paths
from activities.vault.originals import keep_originals
from activities.vault.search import IndexDoc, index_documents
from activities.vault.store import Vault
from schemas.branch import tool_call_ids
from schemas.bundle_memory import (
    BundleMemoryDone,
    BundleMemoryRequest,
    CardLine,
    CardOpLine,
    DailyLine,
    card_op_id,
    entry_block,
    is_session_op,
    owns_op,
)
from schemas.vault.originals import daily_day, linked_originals
from schemas.vault.rollup import entry_marker, split_transcript

__all__ = ["BundleMemoryActivities", "session_memory"]

_STAGE = ("INSERT INTO bundle_memory (request_id, direction, scope, session_id, kind, path,"
          " seq, body) VALUES (%s, 'export', %s, %s, %s, %s, %s, %s)")


async def _session_cards(conn: AsyncConnection, vault: Vault,
                         session_id: str) -> list[CardLine]:
    """The cards the session's ops wrote, as their files stand (a card since removed from
    the vault is left out)."""
    rows = await (await conn.execute(
        "SELECT content FROM messages WHERE session_id = %s AND type = 'assistant'",
        (session_id,))).fetchall()
    calls = {c for (content,) in rows for c in tool_call_ids(content)}
    ops = await (await conn.execute(
        "SELECT op_id, path, outcome FROM vault_ops WHERE scope = %s AND state = 'applied'"
        " AND path IS NOT NULL AND outcome IS DISTINCT FROM 'NOOP'"
        " AND (starts_with(op_id, %s) OR op_id = ANY(%s)) ORDER BY path, op_id",
        (vault.scope, f"flush:{session_id}:",
         [f"tool:{c}" for c in calls] + [card_op_id(session_id, c) for c in calls])
    )).fetchall()
    by_path: dict[str, list[CardOpLine]] = {}
    for op_id, path, outcome in ops:
        if is_session_op(op_id, session_id, calls):
            by_path.setdefault(path, []).append(CardOpLine(op_id=op_id, outcome=outcome))
    cards = []
    for path, card_ops in sorted(by_path.items()):
        target = vault.path(path)
        if target.is_file():
            cards.append(CardLine(path=path, text=read_text(target).text, ops=card_ops))
    return cards


async def _session_entries(conn: AsyncConnection, vault: Vault,
                           session_id: str) -> list[DailyLine]:
    """The session's entries in the daily files its index rows name, word for word."""
    files = await (await conn.execute(
        "SELECT DISTINCT split_part(path, '#', 1) FROM memory_docs WHERE scope = %s"
        " AND kind = 'daily' AND session_id = %s", (vault.scope, session_id))).fetchall()
    entries: list[DailyLine] = []
    for (rel,) in sorted(files):
        target = vault.path(rel)
        if not target.is_file():
            continue
        for sid, seq, text in split_transcript(read_text(target).text):
            if sid == session_id:
                entries.append(DailyLine(path=rel, seq=seq, text=text))
    return sorted(entries, key=lambda e: (e.path, e.seq))


async def session_memory(conn: AsyncConnection, vault: Vault,
                         session_id: str) -> tuple[list[CardLine], list[DailyLine]]:
    return (await _session_cards(conn, vault, session_id),
            await _session_entries(conn, vault, session_id))


async def _forget_ops(conn: AsyncConnection, scope: str, session_id: str) -> None:
    """The session's card ops and flush plans (their ids name it): a new session under its
    id would have its own taken for them, as done already. The cards they wrote stay."""
    for table, key in (("vault_ops", "op_id"), ("rollup_plans", "plan_id")):
        found = await (await conn.execute(
            f"SELECT {key} FROM {table} WHERE scope = %s AND (starts_with({key}, %s)"
            f" OR starts_with({key}, %s))",
            (scope, f"tool:{session_id}:", f"flush:{session_id}:"))).fetchall()
        mine = [k for (k,) in found if owns_op(k, session_id)]
        if mine:
            await conn.execute(f"DELETE FROM {table} WHERE scope = %s AND {key} = ANY(%s)",
                               (scope, mine))


def _body(row: Any) -> dict[str, Any]:
    return row if isinstance(row, dict) else json.loads(row)


class BundleMemoryActivities:
    """The vault's side of a bundle with memory, over the vault worker's memory context."""

    def __init__(self, ctx: MemoryContext) -> None:
        self.ctx = ctx

    @activity.defn(name="stage_bundle_memory")
    async def stage_bundle_memory(self, data: BundleMemoryRequest) -> BundleMemoryDone:
        return await with_heartbeat(self._stage(data))

    async def _stage(self, data: BundleMemoryRequest) -> BundleMemoryDone:
        ctx = self.ctx.scoped(data.scope)
        vault = ctx.vault
        async with vault.lock(), ctx.connection() as conn:
            cards, entries = await session_memory(conn, vault, data.session_id)
            async with conn.transaction():
                await conn.execute(
                    "DELETE FROM bundle_memory WHERE request_id = %s AND direction = 'export'",
                    (data.request_id,))
                async with conn.cursor() as cur:
                    await cur.executemany(_STAGE, [
                        (data.request_id, vault.scope, data.session_id, "card", c.path, 0,
                         c.model_dump_json()) for c in cards] + [
                        (data.request_id, vault.scope, data.session_id, "daily", e.path,
                         e.seq, e.model_dump_json()) for e in entries])
        return BundleMemoryDone(cards=len(cards), entries=len(entries))

    @activity.defn(name="write_bundle_memory")
    async def write_bundle_memory(self, data: BundleMemoryRequest) -> BundleMemoryDone:
        return await with_heartbeat(self._write(data))

    async def _write(self, data: BundleMemoryRequest) -> BundleMemoryDone:
        ctx = self.ctx.scoped(data.scope)
        vault = ctx.vault
        await asyncio.to_thread(vault.ensure)
        async with vault.lock(), ctx.connection() as conn:
            rows = await (await conn.execute(
                "SELECT kind, body, written FROM bundle_memory WHERE request_id = %s"
                " AND direction = 'import' ORDER BY kind, path, seq",
                (data.request_id,))).fetchall()
            staged = [(CardLine.model_validate(_body(b)), w) for k, b, w in rows
                      if k == "card"]
            # (over every staged card: a retry names the forgotten ones again)
            forgotten = await forgotten_paths(conn, vault.scope, [c.path for c, _ in staged])
            cards = [c for c, w in staged if not w and c.path not in forgotten]
            entries = [DailyLine.model_validate(_body(b)) for k, b, w in rows
                       if k == "daily" and not w]
            conflicts = [c.path for c in cards if (t := vault.path(c.path)).exists()
                         and t.read_bytes() != c.text.encode("utf-8")]
            if conflicts:
                return BundleMemoryDone(conflicts=sorted(conflicts))
            await self._write_cards(conn, vault, data, cards)
            await self._written(conn, data, "card", None, forgotten)
            by_file: dict[str, list[DailyLine]] = {}
            for entry in entries:
                by_file.setdefault(entry.path, []).append(entry)
            for path, in_file in sorted(by_file.items()):  # before the entries linking them
                await keep_originals(conn, vault, data.session_id, _linking(path, in_file))
            docs = [d for path, in_file in sorted(by_file.items())
                    for d in _append_entries(vault, data, path, in_file)]
            # One bulk load for every file's entries: the vectors' index is built once at
            # its end when the load is large (7,499 entries: 24 s one file at a time).
            await index_bulk(conn, docs, scope=vault.scope, embedder=vault.embedder)
            for path, in_file in sorted(by_file.items()):
                await self._written(conn, data, "daily", path, [e.seq for e in in_file])
            await conn.execute("DELETE FROM bundle_memory WHERE request_id = %s"
                               " AND direction = 'import'", (data.request_id,))
        return BundleMemoryDone(cards=len(cards), entries=len(entries),
                                forgotten=sorted(forgotten))

    @activity.defn(name="forget_session_memory")
    async def forget_session_memory(self, data: BundleMemoryRequest) -> BundleMemoryDone:
        return await with_heartbeat(self._forget(data))

    async def _forget(self, data: BundleMemoryRequest) -> BundleMemoryDone:
        ctx = self.ctx.scoped(data.scope)
        vault = ctx.vault
        async with vault.lock(), ctx.connection() as conn:
            removed, unreadable = await forget_entries(conn, vault, data.session_id)
            await _forget_ops(conn, vault.scope, data.session_id)
        return BundleMemoryDone(entries=removed, unreadable=unreadable)

    async def _write_cards(self, conn: AsyncConnection, vault: Vault,
                           data: BundleMemoryRequest, cards: list[CardLine]) -> None:
        """The cards written, indexed in one batch, their ops recorded, then marked."""
        if not cards:
            return
        for card in cards:
            vault.write(card.path, card.text)
        await index_documents(conn, [d for c in cards for d in vault.documents_for(
            c.path, c.text)], scope=vault.scope, embedder=vault.embedder)
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO vault_ops (scope, op_id, state, outcome, path) VALUES"
                " (%s, %s, 'applied', %s, %s) ON CONFLICT (scope, op_id) DO NOTHING",
                [(vault.scope, op.op_id, op.outcome, c.path) for c in cards for op in c.ops])
        await conn.execute(
            "UPDATE bundle_memory SET written = true WHERE request_id = %s AND"
            " direction = 'import' AND kind = 'card' AND path = ANY(%s)",
            (data.request_id, [c.path for c in cards]))

    async def _written(self, conn: AsyncConnection, data: BundleMemoryRequest, kind: str,
                       path: str | None, seqs: list[int] | list[str]) -> None:
        """Staged rows written (each statement commits: a retry skips them): a daily
        file's entries by seq; cards (`path` None) by their paths."""
        if path is None:
            await conn.execute(
                "UPDATE bundle_memory SET written = true WHERE request_id = %s AND"
                " direction = 'import' AND kind = %s AND path = ANY(%s)",
                (data.request_id, kind, seqs))
            return
        await conn.execute(
            "UPDATE bundle_memory SET written = true WHERE request_id = %s AND"
            " direction = 'import' AND kind = %s AND path = %s AND seq = ANY(%s)",
            (data.request_id, kind, path, seqs))


def _linking(path: str, entries: list[DailyLine]) -> list[tuple[int, str]]:
    """(seq, day) of the entries of daily file `path` that link originals."""
    day = daily_day(path)
    return [(e.seq, day) for e in entries if day and linked_originals(e.text, day)]


def _append_entries(vault: Vault, data: BundleMemoryRequest, path: str,
                    entries: list[DailyLine]) -> list[IndexDoc]:
    """One daily file's entries appended (those not there already by their marker); returns
    the session's entries of the file as documents to index (the file is only appended
    to: nothing of it goes stale; the rest of it is the beat's)."""
    target = vault.path(path)
    text = read_text(target).text if target.exists() else None
    blocks = "".join(entry_block(e.text) for e in entries if text is None
                     or entry_marker(data.session_id, e.seq) not in text)
    if text is None:
        atomic_write(target, f"# {target.stem}\n{blocks}")
    elif blocks:
        before = vault.file_stamp(path)
        with target.open("ab") as f:
            f.write(blocks.encode("utf-8"))
        vault.note_own_write(path, before)
    return [d for d in vault.documents_for(path, read_text(target).text)
            if d.session_id == data.session_id]
