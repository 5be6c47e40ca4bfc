"""Keel's tests. Importing this package (pytest does, first of all, for tests/conftest.py)
turns on a bytecode cache for the run when Python writes none.

With PYTHONDONTWRITEBYTECODE set (as on this project's machines) every Python process the
suite starts (each xdist worker collecting the suite, every worker process, `keel`
command, MCP server) compiles each module it imports from source: ~12 s of CPU of a
collection's ~19 s, ~4 s of a worker process's ~8 s before it polls. So bytecode is cached
under `.pytest_cache/pycache` (PYTHONPYCACHEPREFIX: never beside a source, checked against
each source's mtime and size as always), set in the environment before pytest-xdist
starts its workers, so they and all their children inherit it. Nothing changes when
Python writes bytecode anyway, or a prefix is chosen already, or the folder cannot be made.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _cache_bytecode() -> None:
    if not sys.dont_write_bytecode or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    prefix = Path(__file__).resolve().parents[1] / ".pytest_cache" / "pycache"
    try:
        prefix.mkdir(parents=True, exist_ok=True)
    except OSError:
        return  # a read-only checkout: compiled from source as before
    os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.pycache_prefix = str(prefix)
    sys.dont_write_bytecode = False


_cache_bytecode()
