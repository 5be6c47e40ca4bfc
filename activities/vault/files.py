"""The vault's files on disk: read (bad UTF-8 counted, never rewritten from), written all
or nothing, and walked for its own markdown notes (a symbolic link is never followed or
read: one may point anywhere on the worker's host, or back into the vault); and git's lock
files a stopped git left behind, which would refuse every later commit.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from activities.disk import atomic_write_bytes
from schemas.vault.schema import GRAPH_DIR

__all__ = ["ReadText", "atomic_write", "read_text", "remove_stale_git_locks", "walk_notes"]

# Far past the longest git step Keel runs on a vault (120 s): a lock file this old is no
# git at work, Keel's (the vault worker holds the vault's lock) or a person's.
STALE_GIT_LOCK_S = 600.0


@dataclass
class ReadText:
    text: str
    # Invalid UTF-8 sequences read as U+FFFD. The file itself is never rewritten from such
    # a reading: that would turn the bad bytes into replacement characters for good.
    bad_sequences: int = 0


# Folders of the vault that hold no notes: git's, the graph's, Obsidian's own.
_NOT_NOTES = frozenset({".git", GRAPH_DIR, ".obsidian", ".trash"})


def _path_order(rel: str) -> tuple[str, ...]:
    return Path(rel).parts


def read_text(path: Path) -> ReadText:
    raw = path.read_bytes()
    try:
        return ReadText(raw.decode("utf-8"))
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        already = raw.decode("utf-8", errors="ignore").count("\ufffd")
        return ReadText(text, bad_sequences=text.count("\ufffd") - already)


def atomic_write(path: Path, text: str) -> None:
    """Write all or nothing: a crash never leaves half a card (activities.disk)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def walk_notes(root: Path, under: str = "") -> tuple[list[str], list[str]]:
    """The markdown files under `root` (or its folder `under`) as relative paths in path
    order, and the links among them (a linked folder as `name/`), never entered."""
    files: list[str] = []
    links: list[str] = []
    start = root / under
    # A folder that is (or lies under) a link is not the vault's own: not entered.
    if under and (not start.is_dir() or start.resolve() != root.resolve() / under):
        return files, links
    for folder, dirs, names in os.walk(start):  # a linked folder is not entered
        here = Path(folder).relative_to(root)
        dirs[:] = [d for d in dirs if (here / d).as_posix() not in _NOT_NOTES]
        for name in names:
            if name.endswith(".md"):
                rel = (here / name).as_posix()
                (links if os.path.islink(os.path.join(folder, name)) else files).append(rel)
        links += [(here / d).as_posix() + "/" for d in dirs
                  if os.path.islink(os.path.join(folder, d))]
    return sorted(files, key=_path_order), sorted(links, key=_path_order)


def remove_stale_git_locks(root: Path, older_than_s: float = STALE_GIT_LOCK_S,
                           since: float | None = None) -> list[str]:
    """Remove git's lock files in `root`'s repository (the index's, HEAD's, a branch's)
    older than `older_than_s`, or, with `since`, made at or after it (a git Keel itself
    just stopped); what was removed, for a person."""
    git = root / ".git"
    removed = []
    now = time.time()
    for lock in [git / "index.lock", git / "HEAD.lock", *(git / "refs").glob("**/*.lock")]:
        with contextlib.suppress(FileNotFoundError):
            made = lock.lstat().st_mtime
            if now - made >= older_than_s or (since is not None and made >= since):
                lock.unlink()
                removed.append(f"{lock.relative_to(root)} ({now - made:.0f} s old) removed: "
                               "a git stopped mid-way left it, and git would refuse every "
                               "commit while it stays")
    return removed
