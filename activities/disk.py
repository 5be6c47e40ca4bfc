"""A file on disk written whole or not at all, for the workspace's local store and the
vault alike.

Invariant: a write goes to a file of its own in the target's folder, named `.keel-` and
eight of `tempfile`'s characters and `.tmp` (`is_partial`), and is renamed into place; a
crash or a kill leaves the old file whole, and at most such a partial file beside it, which
no listing shows and no vault commit takes (`PARTIAL_GLOB`).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

__all__ = ["PARTIAL_GLOB", "atomic_write_bytes", "is_partial"]

_PREFIX, _SUFFIX = ".keel-", ".tmp"
_PARTIAL = re.compile(rf"{re.escape(_PREFIX)}[a-z0-9_]{{8}}{re.escape(_SUFFIX)}")
# The same names for git's pathspec, which takes no pattern finer than a glob.
PARTIAL_GLOB = f"{_PREFIX}*{_SUFFIX}"


def is_partial(name: str) -> bool:
    """Whether a file's name is a write's before its rename (what a killed one leaves)."""
    return _PARTIAL.fullmatch(name) is not None


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` all or nothing (its folders made first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_PREFIX, suffix=_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
