"""The build id Keel's workers give Temporal: which code they run, computed cheaply.

Invariant: the id is a hash of the bytes of Keel's own source files (the packages a worker
imports its workflows and activities from) and the Temporal SDK's version, read once per
process; the same checkout gives the same id on every host. Nothing is compiled: the SDK's
default (`load_default_build_id`) hashes the bytecode of every loaded module, and where
Python writes no bytecode (PYTHONDONTWRITEBYTECODE, as on this project's machines) that
compiles every one of them from source, thousands of modules, seconds of CPU at every
worker's start. Keel uses no worker versioning: the id names the code in the history
(each workflow task's completion), for people reading it.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import temporalio

__all__ = ["KEEL_PACKAGES", "keel_build_id"]

ROOT = Path(__file__).resolve().parent.parent
KEEL_PACKAGES = ("activities", "keel", "schemas", "workers", "workflows")


@cache
def keel_build_id() -> str:
    digest = hashlib.blake2b(digest_size=12)
    digest.update(f"temporalio {temporalio.__version__}\n".encode())
    for package in KEEL_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            digest.update(path.relative_to(ROOT).as_posix().encode() + b"\n")
            digest.update(path.read_bytes())
    return f"keel-{digest.hexdigest()}"
