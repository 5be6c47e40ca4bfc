"""Bytecode for the workflow modules Temporal's sandbox imports, when Python writes none.

The sandbox imports a workflow's module afresh for every workflow instance: a new session,
a child session, every continue-as-new, a replay after the worker's cache let it go. With
PYTHONDONTWRITEBYTECODE set (common in containers, and so on this project's machines) no
.pyc is ever cached, so each of those imports compiles the module from source:
~9 ms for workflows/session.py on a quiet 2-core machine, on the path of every child
session's first workflow task (the delegate round trip).

Invariant: only when bytecode writing is off and no pycache prefix is set, the worker
compiles each workflow module once into a private pycache prefix (a temporary directory of
its own, removed at exit) and points `sys.pycache_prefix` at it. importlib then reads,
never writes, bytecode there, checked against the source's mtime and size as always (a
changed source compiles as before); modules without bytecode there import as before.
Nothing is written to the source tree.
"""

from __future__ import annotations

import atexit
import importlib.util
import py_compile
import shutil
import sys
import tempfile
from collections.abc import Iterable

__all__ = ["precompile_workflow_modules"]


def precompile_workflow_modules(classes: Iterable[type]) -> list[str]:
    """Compile the modules defining `classes` into the private prefix; the paths written
    (none when Python writes bytecode itself, or a prefix is set already)."""
    if not sys.dont_write_bytecode:
        return []  # importlib caches them itself
    if sys.pycache_prefix is None:
        prefix = tempfile.mkdtemp(prefix="keel-pycache-")
        atexit.register(shutil.rmtree, prefix, True)
        sys.pycache_prefix = prefix
    elif "keel-pycache-" not in sys.pycache_prefix:
        return []  # someone else's: left alone
    written: list[str] = []
    names = {cls.__module__ for cls in classes}
    names |= {name.rsplit(".", i)[0] for name in names for i in range(1, name.count(".") + 1)}
    for name in sorted(names):  # the modules and the packages above them
        module = sys.modules.get(name)
        source = getattr(module, "__file__", None)
        if not source or not source.endswith(".py"):
            continue
        cached = importlib.util.cache_from_source(source)  # under the prefix
        py_compile.compile(source, cfile=cached, doraise=True)
        written.append(cached)
    return written
