"""A worker's copy of the window rows it read last, checked against the record on every read.

Invariants:
- The record says, on every read, which rows a window holds, in what order, and each one's
  revision (`rev`, migration 010: every insert and update of a message takes a new one).
  A row is taken from this copy only when the read names the same (seq, rev) for it; equal
  revisions are equal rows, so a window read here is the window the record holds.
- Rows are held per server run (activities.window.server_of: the database, and when its
  server started): a server that restarted or took over after a failover may have lost
  the newest writes and hand their revisions out again, so nothing held from another run
  is taken for it.
- Content only ever comes from PostgreSQL: a row this worker does not hold at the revision
  the read names (a new row, an edited one, one evicted, one another worker wrote with a
  revision below the newest this worker has seen) is read from the record in the same call.
- Bounded: at most `max_chars` (about; text and content) across sessions, the sessions
  least recently read dropped first. A session keeps only the rows of its last read, so a
  checkpoint that moves the window's start frees what moved out.
- A row is shared between the reads that take it: `RecordRow` is frozen, and its content
  is read, never written (the request's assembly copies what it marks).

Why: every model call reads its whole window; decoding it (JSON, then the row model) is
O(window) CPU a call (0.1 to 0.2 s at 10,000 rows), and a turn may make dozens of calls.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from schemas.attachments import attachments_of
from schemas.config import DEFAULT_ROW_CACHE_CHARS
from schemas.messages import RecordRow

__all__ = ["HeldRows", "Key", "RowCache", "row_cache", "row_chars"]

# What a row costs beyond its text, about: its content's structure, the row model.
ROW_OVERHEAD_CHARS = 200

Key = tuple[str, str]  # (the server run, activities.window.server_of; the session)


def row_chars(row: RecordRow) -> int:
    """About what holding the row costs, in characters (text, and content counted as its
    tokens' worth: a tool call's input, a result's metadata; a file's bytes, which a window
    read leaves out (activities.window), as their base64)."""
    data = sum(len(item.get("data") or "") for item in attachments_of(row.content))
    return len(row.text) + 4 * row.token_count + ROW_OVERHEAD_CHARS + data


@dataclass
class HeldRows:
    """One session's rows as this worker read them last, by seq: (rev, row)."""

    rows: dict[int, tuple[int, RecordRow]] = field(default_factory=dict)
    newest_rev: int = -1  # the highest revision among them
    chars: int = 0

    def get(self, seq: int, rev: int) -> RecordRow | None:
        held = self.rows.get(seq)
        return held[1] if held is not None and held[0] == rev else None


class RowCache:
    """Sessions' rows held between reads, least recently read evicted first."""

    def __init__(self, max_chars: int = DEFAULT_ROW_CACHE_CHARS) -> None:
        self.max_chars = max_chars
        self._held: OrderedDict[Key, HeldRows] = OrderedDict()
        self._chars = 0
        # Activities share one event loop, but a process may run workers on several
        # (tests do): the bookkeeping is kept whole under a lock.
        self._lock = threading.Lock()

    @property
    def chars(self) -> int:
        return self._chars

    def held(self, key: Key) -> HeldRows:
        """What this worker holds of the session (empty when nothing), marked as just used."""
        with self._lock:
            found = self._held.get(key)
            if found is None:
                return HeldRows()
            self._held.move_to_end(key)
            return found

    def keep(self, key: Key, rows: list[tuple[int, RecordRow]]) -> None:
        """The session's rows as just read, (rev, row), in place of what was held."""
        held = HeldRows(rows={entry[1].seq: entry for entry in rows},
                        newest_rev=max((rev for rev, _ in rows), default=-1),
                        chars=sum(row_chars(row) for _, row in rows))
        with self._lock:
            old = self._held.pop(key, None)
            if old is not None:
                self._chars -= old.chars
            if held.chars > self.max_chars:
                return  # larger than the whole cache (or the cache is off): not held
            self._held[key] = held
            self._chars += held.chars
            while self._chars > self.max_chars:
                _, dropped = self._held.popitem(last=False)
                self._chars -= dropped.chars

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._chars = 0


# One per worker process, sized by KeelSettings.row_cache_chars (KEEL_ROW_CACHE_CHARS; 0
# turns it off: every read decodes every row) when the worker's session context is built.
row_cache = RowCache()
