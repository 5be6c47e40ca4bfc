"""What every benchmark script prints with: percentiles, plain tables, the commit measured."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100), linear between the closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                         enumerate(zip(r, widths, strict=True)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([title, line(cells[0]), rule, *(line(r) for r in cells[1:])])


def source_commit(root: Path = ROOT) -> str:
    """The commit checked out at `root` (read only), so a figure can be traced to its code."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def write_results(path: Path, benchmark: str, started: float, **fields: Any) -> None:
    """A run's figures at `path`, with what traces them: the commit measured, the date, the
    machine's cores, and how long the run took (since `started`, `time.time()`)."""
    path.write_text(json.dumps({
        "benchmark": benchmark, "commit": source_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
        **fields, "seconds": round(time.time() - started, 1)}, indent=1) + "\n")
    print(f"written to {shown(path)}")


def shown(path: Path) -> Path:
    """A results file as a benchmark names it when done: from the repository's root when it
    lies under it (every default), else as given (an absolute `--out`)."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def cancel_on_sigterm() -> None:
    """A `timeout` or `kill` cancels the run, so the stack still stops and is removed."""
    task = asyncio.current_task()
    if task is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
