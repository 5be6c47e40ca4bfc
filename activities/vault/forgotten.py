"""What a memory scope forgot: the cards a person had it forget (`keel vault forget`:
activities.vault.forget writes `memory_forgotten`), asked by the cards' paths, which an
import with memory leaves out where it stages the bundle's cards (activities.bundle) and
where the vault writes them (activities.bundle_memory); and a session's daily-note
entries taken out (`forget_entries`): all of them when the session is deleted, those of
its rewound messages after a rewind (activities.vault.outbox).

Invariants:
- A card is keyed as the forgetting keyed it, by its file name
  (schemas.vault.card.link_key), whatever folder the path names.
- Entries go from the daily files their index rows name and those of the messages' days,
  each file rewritten whole with the rest byte for byte (a file holding bytes that are
  not UTF-8 is never rewritten from a lossy reading: named as unreadable, left), with the
  originals only they linked, then their index rows. Run again, it finds nothing more.
  The caller holds the vault's lock (the vault's one writer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from psycopg import AsyncConnection

from activities.vault.files import atomic_write, read_text
from activities.vault.originals import forget_originals
from activities.vault.search import delete_documents
from activities.vault.store import Vault
from schemas.vault.card import link_key
from schemas.vault.rollup import drop_session_entries
from schemas.vault.schema import DAILY_DIR

__all__ = ["forget_entries", "forgotten_paths"]


async def forgotten_paths(conn: AsyncConnection, scope: str, paths: list[str]) -> list[str]:
    """The paths among `paths` (cards') whose card `scope` forgot, sorted."""
    if not paths:
        return []
    keys = {link_key(p): p for p in paths}
    rows = await (await conn.execute(
        "SELECT card_key FROM memory_forgotten WHERE scope = %s AND card_key = ANY(%s)",
        (scope, sorted(keys)))).fetchall()
    return sorted(keys[key] for (key,) in rows)


async def forget_entries(conn: AsyncConnection, vault: Vault, session_id: str,
                         seqs: Collection[int] | None = None,
                         days: Collection[str] = ()) -> tuple[int, list[str]]:
    """`session_id`'s daily-note entries out of `vault` (only those of `seqs` when given;
    `days`: files to look in besides those the index names, `daily/<day>.md`): how many
    went, and the files left unreadable. Under the vault's lock."""
    query = ("SELECT path FROM memory_docs WHERE scope = %s AND kind = 'daily'"
             " AND session_id = %s")
    args: list[object] = [vault.scope, session_id]
    if seqs is not None:
        query, args = query + " AND seq = ANY(%s)", [*args, list(seqs)]
    docs = [path for (path,) in await (await conn.execute(query, args)).fetchall()]
    files = {path.split("#", 1)[0] for path in docs} | {f"{DAILY_DIR}/{day}.md" for day in days}
    removed, unreadable = 0, []
    for rel in sorted(files):
        target = vault.path(rel)
        if not target.is_file():
            continue
        found = read_text(target)
        if found.bad_sequences:
            unreadable.append(rel)
            continue
        text, dropped = drop_session_entries(found.text, session_id, seqs)
        if dropped:
            before = vault.file_stamp(rel)
            await asyncio.to_thread(atomic_write, target, text)
            vault.note_own_write(rel, before)
            removed += dropped
            forget_originals(vault, rel, found.text, text)
    await delete_documents(conn, docs, scope=vault.scope)
    return removed, unreadable
