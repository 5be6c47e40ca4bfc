"""A message's files written into its memory scope's vault as originals, and deleted when
no transcript entry links them any longer (their paths and links: schemas.vault.originals).

Invariants:
- An original is written before the entry that links it, all or nothing: a crash between
  leaves a file no entry links yet, which the retry finds in place (its path is its
  content's, so one there already is not written again). A link the vault's writer made
  never points at nothing.
- Its bytes are the record's (the row's, the very bytes the model was sent), read a row at
  a time and only for the entries being appended: a day of screenshots never sits in
  memory at once.
- Forgetting a session's entries deletes the originals they linked that the day's
  transcript, as rewritten, links no longer (and the day's folder once empty); an
  original another entry links stays.
- Called by the vault's one writer under the vault's lock (activities.vault.turn,
  activities.bundle_memory).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Iterable

from psycopg import AsyncConnection

from activities.disk import atomic_write_bytes
from activities.vault.store import Vault
from schemas.vault.originals import daily_day, linked_originals, original_path

__all__ = ["forget_originals", "keep_originals"]


async def keep_originals(conn: AsyncConnection, vault: Vault, session_id: str,
                         entries: Iterable[tuple[int, str]]) -> int:
    """The originals of the files of `session_id`'s rows `entries` ((seq, the day of its
    transcript entry)) written where not there yet; how many were written."""
    written = 0
    for seq, day in entries:
        row = await (await conn.execute(
            "SELECT content->'attachments' FROM messages WHERE session_id = %s AND seq = %s"
            " AND jsonb_typeof(content->'attachments') = 'array'", (session_id, seq))).fetchone()
        for item in (row[0] if row else None) or []:
            if not isinstance(item, dict) or not isinstance(item.get("data"), str):
                continue
            target = vault.path(original_path(day, item))
            if target.is_file():
                continue
            await asyncio.to_thread(atomic_write_bytes, target, base64.b64decode(item["data"]))
            written += 1
    return written


def forget_originals(vault: Vault, rel: str, before: str, after: str) -> list[str]:
    """Delete the originals daily file `rel`'s text `before` linked that its text `after`
    (without a session's entries) links no longer; the vault paths deleted."""
    day = daily_day(rel)
    if day is None:
        return []
    removed = []
    for path in sorted(linked_originals(before, day) - linked_originals(after, day)):
        with contextlib.suppress(FileNotFoundError):
            vault.path(path).unlink()
            removed.append(path)
    if removed:
        with contextlib.suppress(OSError):  # the day's folder, when nothing is left in it
            vault.path(removed[0]).parent.rmdir()
    return removed
