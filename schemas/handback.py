"""A sub-agent's files coming home: what a child made or changed in its workspace goes to
its parent's with its answer, and the answer says where. Pure.

Invariants:
- What comes back: every file of the child's workspace it made or changed; a file its task
  carried and it left as it was does not, and Keel's own files (`.keel/`: kept results,
  checkpoint scratch) never do; when the delegate call named `bring_back` patterns, only
  the files they match (schemas.delegation.brought). At most `HANDBACK_FILES`, in path
  order; the rest stay in the child's workspace, named or counted.
- Where (`destination`): the same path when the parent has no file there, has those very
  bytes, or still has the version it gave the child (the child's edit of it comes home).
  A parent's file that changed meanwhile (a person put a new version while the child
  worked), or one it never gave the child, is never overwritten: the child's goes beside
  it, under `subagents/<agent>-<call>/` (`conflict_path`), one folder per delegate call.
- The parent's model learns it from one line Keel writes at the end of the answer
  (`handback_line`), bounded whatever the count: the files and where each went, the ones
  left in the child's workspace and why. A file's name is shown as the store took it.
  The first `HANDBACK_SHOWN` images that came home it also sees, with the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.delegation import ANSWER_CHARS

__all__ = ["HANDBACK_FILES", "HANDBACK_SHOWN", "HandedBack", "conflict_path", "destination",
           "handback_line", "is_keels", "with_line"]

HANDBACK_FILES = 100  # files of one child copied back at most
HANDBACK_SHOWN = 5  # images of them shown to the parent's model with the answer
_NAMED = 20  # files the line names by name, of each kind; the rest are counted
_KEELS = ".keel/"


def is_keels(path: str) -> bool:
    """A file Keel keeps for itself in a workspace: never handed back."""
    return path.startswith(_KEELS)


def conflict_path(child_session: str, parent_session: str, path: str) -> str:
    """Where a child's file goes when the parent's at `path` may not be overwritten:
    `subagents/<agent>-<the call id's last 8>/<path>` (the child's id is
    `<parent>.<agent>.<call>`: schemas.initiative.child_session_id)."""
    tail = child_session.removeprefix(parent_session + ".")
    agent, _, call = tail.rpartition(".")
    return f"subagents/{agent or 'sub-agent'}-{call[-8:]}/{path}"


def destination(path: str, child_sha: str, shared_sha: str | None, parent_sha: str | None,
                child_session: str, parent_session: str) -> str:
    """Where the child's file at `path` (its bytes' digest `child_sha`) goes in the
    parent's workspace. `shared_sha`: the digest of the file the task carried at that
    path (None: it carried none); `parent_sha`: of the parent's file there now (None:
    there is none)."""
    if parent_sha is None or parent_sha == child_sha or parent_sha == shared_sha:
        return path
    return conflict_path(child_session, parent_session, path)


@dataclass(frozen=True)
class HandedBack:
    """One file of the child's: where it went in the parent's workspace (None: it stayed
    in the child's, `why`), and whether the parent gave it to the child (an edit)."""

    path: str
    to: str | None
    edited: bool = False
    why: str = ""


def _named(items: list[str]) -> str:
    shown = ", ".join(items[:_NAMED])
    return shown + (f" and {len(items) - _NAMED} more" if len(items) > _NAMED else "")


def handback_line(files: list[HandedBack], child_session: str, past: int = 0,
                  kept: int = 0) -> str:
    """The answer's last line: what came back and where, and what stayed (`past`: files
    past the `HANDBACK_FILES` copied; `kept`: files it wrote the call did not ask back;
    empty when nothing came back or stayed)."""
    home = [f.path + (" (your file, as it edited it)" if f.edited else "")
            for f in files if f.to == f.path]
    beside = [f"{f.path} (at {f.to}: your {f.path} is another file)"
              for f in files if f.to is not None and f.to != f.path]
    left = [f"{f.path} ({f.why})" for f in files if f.to is None]
    parts = []
    if home or beside:
        parts.append("the files it wrote are in your workspace: " + _named(home + beside))
    if past:
        left.append(f"{past} more file{'s' * (past != 1)} (past the first {HANDBACK_FILES})")
    if kept:
        left.append(f"{kept} other file{'s' * (kept != 1)} (not asked back)")
    if left:
        parts.append(f"left in its workspace (session {child_session}): " + _named(left))
    return f"[Keel: {'; '.join(parts)}]" if parts else ""


def with_line(words: str, line: str) -> str:
    """An answer of `words` ending with `line`, within ANSWER_CHARS (the words are cut, so
    the line always arrives)."""
    if not line:
        return words[:ANSWER_CHARS]
    return f"{words[:max(0, ANSWER_CHARS - len(line) - 2)]}\n\n{line}".lstrip("\n")
