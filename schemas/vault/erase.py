"""Erasing a memory scope: all long memory holds of it (a person's, a team's, a tenant's)
gone at once, where deleting a session takes only that session's words and leaves the
scope's knowledge.

Invariants:
- Erasing takes the scope's vault folder whole (CORE.md, the cards, the daily notes, the
  rollups, and the git history that holds every earlier version of them) and every row of
  the scope in long memory's tables (activities.vault.erase); no other scope's file or row
  is touched, and nothing of the sessions' own record (a session's workspace is keyed by
  its id, not by a memory scope). The scope's doctor and rollup runs leave Temporal too
  (their reports name its card files).
- It is refused while a session of the scope runs: its next turn would write there again.
  Ended sessions keep their records unless the erasure deletes them first (`with_sessions`).
- Run again, it finds nothing more and says so (`ScopeErased.found`).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = ["ERASE_SCOPE_WORKFLOW", "EraseScopeInput", "ScopeErased", "erased_text",
           "running_text"]

ERASE_SCOPE_WORKFLOW = "EraseMemoryScope"


class EraseScopeInput(BaseModel):
    """The vault activity's work: erase `scope` (a checked scope id). Erasing is the same
    however often it runs, so it needs no request id."""

    scope: str


class ScopeErased(BaseModel):
    """What an erasure took: the vault folder (None when the scope had none), how many
    files it held, and the rows of each table it deleted (only the nonzero ones)."""

    scope: str
    folder: str | None = None
    files: int = 0
    rows: dict[str, int] = Field(default_factory=dict)
    sessions_deleted: list[str] = Field(default_factory=list)
    runs: int = 0  # its doctor and rollup runs deleted from Temporal
    copies: int = 0  # its CORE.md and schema.json as published for the session workers

    @property
    def found(self) -> bool:
        return (self.folder is not None or bool(self.rows) or bool(self.sessions_deleted)
                or self.runs > 0 or self.copies > 0)


def running_text(scope: str, running: list[str]) -> str:
    """The refusal while sessions of the scope run (at most five named)."""
    named = ", ".join(running[:5]) + (f" and {len(running) - 5} more" if len(running) > 5
                                      else "")
    return (f"memory scope {scope!r} is in use by {len(running)} running session(s) ({named}): "
            "end them first (keel end SESSION), or erase with its sessions and --force "
            "(--with-sessions --force) to stop and delete them; nothing was erased")


def erased_text(done: ScopeErased) -> str:
    """What an erasure took, in a line a person reads."""
    if not done.found:
        return (f"no long memory of scope {done.scope!r} here (keel vault list names the "
                "scopes); nothing was erased")
    parts = []
    if done.sessions_deleted:
        parts.append(f"{len(done.sessions_deleted)} session(s) deleted first")
    parts.append(f"its vault folder {done.folder} ({done.files} file(s), with its git history)"
                 if done.folder else "no vault folder")
    if done.copies:
        parts.append(f"{done.copies} file(s) published from it for the session workers "
                     "(CORE.md, schema.json)")
    rows = sum(done.rows.values())
    parts.append(f"{rows} row(s) of its index and queues" + (
        " (" + ", ".join(f"{t} {n}" for t, n in sorted(done.rows.items())) + ")" if rows
        else ""))
    if done.runs:
        parts.append(f"{done.runs} doctor and rollup run(s) out of Temporal")
    return f"erased memory scope {done.scope!r}: " + "; ".join(parts)
