"""The vault worker's transcript drain: what one turn's transcript costs, and how many turns
a second the one vault writer can take in.

    .venv/bin/python bench/bench_transcripts.py [--sessions 20] [--turns 40] [--out PATH]

Every turn's transcript (the user's message and the reply) is queued in the record with
the reply (`activities.vault.outbox`) and the vault worker drains the queue: the daily file
appended, each entry indexed for BM25 and embedded for hybrid search. There is one vault
writer per deployment, however many session workers there are, so its drain rate is a
ceiling on a deployment's turns per second. Two ways rows reach the drainer:

- **one row a drain**: a quiet deployment, each turn's row drained on its own (the
  drainer wakes on the reply's notification);
- **a backlog**: many sessions replying at once, the rows waiting when the drainer wakes
  (drained as the running worker does: a drain of up to `BATCH` rows after another);
- **arriving at a rate** (20 and 50 a second), the drainer running as the vault worker
  runs it (woken by each reply's notification, then its settle), with the settle it has
  (15 ms) and a longer one (100 ms): what a longer settle would save.

Printed and written (`bench/results/transcripts.json`): rows (turns) a second, and CPU per
row of the drainer's process and of PostgreSQL (every backend, from /proc). Messages are
synthetic chat text of 40-250 words (`bench_memory.filler_docs`' bodies), each session's
turns timestamped on one day, so the day's file is shared as in a real vault. It starts its
own embedded PostgreSQL in a temporary folder, removed after; the vault is the built-in
embedder's when installed (the `embeddings` extra), as `keel dev` runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from activities.db import close_pools
from activities.vault.embedder import embedder_for
from activities.vault.outbox import QueuedTranscript, TranscriptDrainer, queue_transcript
from activities.vault.turn import MemoryActivities
from bench.bench_memory import filler_docs, fresh_database
from bench.common import ROOT, shown, source_commit, table
from bench.procs import postmaster_pid, tree_cpu
from bench.stack import machine
from keel.devstack import temporary_postgres
from schemas.vault.scope import DEFAULT_SCOPE
from tests.vault.support import insert_messages, vault_ctx
from workers.worker import model_backends

RESULTS = ROOT / "bench" / "results" / "transcripts.json"
# Rows arriving one by one at a rate, the drainer running (woken by each commit's
# notification, then waiting its settle): the rates of a quiet and a busy deployment, each
# with the settle the drainer has (15 ms) and a longer one.
PACED = [(20, 0.015), (20, 0.1), (50, 0.015), (50, 0.1)]
PACED_ROWS = 120
QUEUE = "keel-vault"
DAY = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)


def record_turns(url: str, sessions: int, turns: int) -> None:
    """`turns` exchanges (a user message, a reply) of each session in the record."""
    texts = [d.body for d in filler_docs(sessions * turns * 2, seed=11)]
    for s in range(sessions):
        rows = []
        for t in range(turns):
            at = DAY + timedelta(minutes=t)
            for k, kind in ((1, "user"), (2, "assistant")):
                seq = 2 * t + k
                rows.append((seq, kind, texts[(s * turns + t) * 2 + k - 1], at))
        insert_messages(url, f"s{s}", rows)


async def queue_rows(url: str, rows: list[tuple[int, int]]) -> None:
    """Queue the transcripts of (session, turn) rows, each as its reply's transaction does."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for s, t in rows:
            await queue_transcript(conn, QUEUE, QueuedTranscript(
                session_id=f"s{s}", scope=DEFAULT_SCOPE, reply_seq=2 * t + 2,
                seqs=[2 * t + 1, 2 * t + 2], recalled=[]))


class Meter:
    """Wall time and CPU of this process and of PostgreSQL across a block."""

    def __init__(self, pgdata: Path) -> None:
        pid = postmaster_pid(pgdata)
        if pid is None:
            raise SystemExit(f"no postmaster.pid in {pgdata}")
        self.pid = pid

    def read(self) -> tuple[float, float, float]:
        return time.perf_counter(), time.process_time(), tree_cpu(self.pid)

    def per_row(self, before: tuple[float, float, float], rows: int) -> dict[str, float]:
        wall, cpu, pg = (b - a for a, b in zip(before, self.read(), strict=True))
        return {"rows": rows, "rows_per_second": round(rows / wall, 1),
                "drainer_cpu_ms_per_row": round(1000 * cpu / rows, 2),
                "postgres_cpu_ms_per_row": round(1000 * pg / rows, 2),
                "wall_ms_per_row": round(1000 * wall / rows, 2)}


async def run(admin: str, pgdata: Path, sessions: int, turns: int) -> dict[str, Any]:
    url = fresh_database(admin, "keel_bench_transcripts")
    record_turns(url, sessions, turns)
    with tempfile.TemporaryDirectory(prefix="keel-bench-vault-") as tmp:
        ctx = vault_ctx(Path(tmp), url)
        memory = MemoryActivities(ctx, model_backends())

        async def told(session_id: str, message: str) -> None:
            raise SystemExit(f"a transcript failed: {session_id}: {message}")
        drainer = TranscriptDrainer(url, QUEUE, memory, told)
        order = [(s, t) for t in range(turns) for s in range(sessions)]  # turns interleave
        paced, rest = order[-len(PACED) * PACED_ROWS:], order[:-len(PACED) * PACED_ROWS]
        third = len(rest) // 3
        warm, single, backlog = rest[:third], rest[third:2 * third], rest[2 * third:]
        await queue_rows(url, warm)  # a day already under way
        while await drainer.drain_once():
            pass
        meter = Meter(pgdata)
        before = meter.read()
        for row in single:
            await queue_rows(url, [row])
            await drainer.drain_once()
        one = meter.per_row(before, len(single))
        await queue_rows(url, backlog)
        before = meter.read()
        while await drainer.drain_once():
            pass
        many = meter.per_row(before, len(backlog))
        arriving = {}
        for i, (rate, settle) in enumerate(PACED):
            rows = paced[i * PACED_ROWS:(i + 1) * PACED_ROWS]
            arriving[f"{rate}/s, settle {int(settle * 1000)} ms"] = await drain_paced(
                url, meter, TranscriptDrainer(url, QUEUE, memory, told, settle_s=settle),
                rows, rate)
        entries = (ctx.vault.root / "daily" / "2026-06-01.md").read_text().count(
            "<!-- keel:")
    await close_pools()
    if entries != 2 * len(order):
        raise SystemExit(f"{entries} entries in the day file, {2 * len(order)} queued")
    embedder = embedder_for(ctx.memory)
    return {"one_row_a_drain": one, "backlog": many, "arriving": arriving,
            "entries_in_day_file": entries,
            "embedder": embedder.name if embedder is not None else None}


async def drain_paced(url: str, meter: Meter, drainer: TranscriptDrainer,
                      rows: list[tuple[int, int]], rate: float) -> dict[str, float]:
    """Rows queued one by one at `rate` a second (each in its own transaction, whose
    commit notifies) while the drainer runs as the vault worker runs it; until the queue
    is empty."""
    async with drainer.running():
        while not drainer.sweeps:  # listening, its first sweep done
            await asyncio.sleep(0.01)
        sweeps, before = drainer.sweeps, meter.read()
        start = time.perf_counter()
        for n, row in enumerate(rows):
            await asyncio.sleep(max(0.0, start + n / rate - time.perf_counter()))
            await queue_rows(url, [row])
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            while (await (await conn.execute(
                    "SELECT count(*) FROM transcript_outbox")).fetchone() or (0,))[0]:
                await asyncio.sleep(0.01)
        figures = meter.per_row(before, len(rows))
        figures["rows_per_drain"] = round(len(rows) / max(1, drainer.sweeps - sweeps), 2)
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--turns", type=int, default=70, help="exchanges a session")
    parser.add_argument("--out", type=Path, help="results file (default: "
                        "bench/results/transcripts.json for the default run)")
    args = parser.parse_args()
    commit = source_commit()  # the code measured: read before the run
    started = time.perf_counter()
    with temporary_postgres("keel-bench-pg-") as admin:
        with psycopg.connect(admin) as conn:  # the server's folder: its postmaster.pid
            row = conn.execute("SHOW data_directory").fetchone()
        if row is None:
            raise SystemExit("the server did not say its data folder")
        pgdata = Path(str(row[0]))
        figures = await run(admin, pgdata, args.sessions, args.turns)
    out = {"benchmark": "transcripts",
           "machine": {**machine(), "commit": commit, "load_average": list(os.getloadavg())},
           "sessions": args.sessions, "turns": args.turns, **figures,
           "total_seconds": round(time.perf_counter() - started, 1)}
    print(table("The vault worker's transcript drain (a row = one turn: two entries)",
                ["rows arrive", "rows", "rows/s", "drainer CPU ms/row",
                 "PostgreSQL CPU ms/row"],
                [[name, f["rows"], f["rows_per_second"], f["drainer_cpu_ms_per_row"],
                  f["postgres_cpu_ms_per_row"]]
                 for name, f in (("one a drain", figures["one_row_a_drain"]),
                                 ("as a backlog", figures["backlog"]),
                                 *figures["arriving"].items())]))
    default = (args.sessions, args.turns) == (20, 70)
    path = args.out or (RESULTS if default else RESULTS.with_name("transcripts-custom.json"))
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"total {out['total_seconds']} s at commit {commit}; written to {shown(path)}")


if __name__ == "__main__":
    asyncio.run(main())
