"""CPU time of the processes a benchmark runs, read from /proc (Linux), no dependency.

A process tree's CPU is every live member's user + system time plus what each has collected
from children it waited for, so a PostgreSQL backend that exits between two readings moves
from the live sum to its parent's waited-for share and is never counted twice or lost.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its waited-for children."""
    fields = _stat(pid)
    return 0.0 if fields is None else sum(int(x) for x in fields[11:15]) / TICK


def _parents() -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None:
                out[int(entry.name)] = int(fields[1])
    return out


def descendants(root: int) -> list[int]:
    """`root` and every live process below it."""
    parents = _parents()
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        tree.extend(frontier)
    return tree


def tree_cpu(root: int) -> float:
    return sum(cpu_seconds(pid) for pid in descendants(root))


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def child_matching(root: int, words: Iterable[str]) -> int | None:
    """The first process below `root` whose command line holds every word."""
    wanted = list(words)
    for pid in descendants(root)[1:]:
        line = cmdline(pid)
        if all(w in line for w in wanted):
            return pid
    return None


def postmaster_pid(pgdata: Path) -> int | None:
    """PostgreSQL's postmaster, from the first line of its data folder's postmaster.pid."""
    try:
        return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def stack_processes(data_dir: Path) -> dict[str, int]:
    """The embedded stack this process started under `data_dir`: the Temporal dev server and
    PostgreSQL's postmaster (whose tree holds the backends; read it with `tree_cpu`)."""
    temporal = child_matching(os.getpid(), ["temporal", "start-dev"])
    pg = postmaster_pid(data_dir / "postgres")
    if temporal is None or pg is None:
        raise RuntimeError(f"stack processes not found (temporal {temporal}, pg {pg})")
    return {"temporal_server": temporal, "postgres": pg}
