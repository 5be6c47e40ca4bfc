"""Search with memory scopes: ten scopes of 10,000 documents against one scope of 100,000.

    .venv/bin/python bench/bench_scopes.py [--per-scope 10000] [--scopes 10] [--repeat 3]

Three layouts of the same search index (one PostgreSQL database each), the built-in corpus
(tests/vault/fixtures/search_corpus, English and Russian queries with known answers) buried
among synthetic filler documents (bench/bench_memory.py's corpus machinery):

- one scope holding 100,000 documents (what one shared vault for ten people would be);
- ten scopes of 10,000 documents each in the same tables, queried in the scope holding the
  corpus (every query filtered by scope, per-scope BM25 statistics);
- one scope of 10,000 documents alone (the same scope size with no neighbours).

Printed: recall@5 and MRR of the corpus queries, p50 / p95 latency of a recall query (k=5,
BM25 + graph rerank). Written to bench/results/scopes.json. Not a test: nothing fails on a
bad number. It starts its own embedded PostgreSQL in a temporary folder, removed after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from activities.db import close_pools
from activities.vault.search import search
from bench.bench_memory import bulk_index, filler_docs, fresh_database
from bench.common import ROOT, percentile, source_commit, table
from keel.devstack import temporary_postgres
from schemas.vault.search import recall_at_k, reciprocal_rank
from tests.vault.support import load_corpus, make_ctx

RESULTS = ROOT / "bench" / "results"


async def measure(url: str, scope: str, queries: list[dict], repeat: int) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        r5 = mrr = 0.0
        for q in queries:
            paths = [h.path for h in await search(conn, q["query"], scope=scope, k=10)]
            r5 += recall_at_k(paths, set(q["relevant"]))
            mrr += reciprocal_rank(paths, set(q["relevant"]))
        times = []
        for _ in range(repeat):
            for q in queries:
                t0 = time.perf_counter()
                await search(conn, q["query"], scope=scope, k=5)
                times.append((time.perf_counter() - t0) * 1000)
        docs = (await (await conn.execute(
            "SELECT count(*) FILTER (WHERE scope = %s), count(*) FROM memory_docs",
            (scope,))).fetchone())
        assert docs is not None  # an aggregate gives one row
    return {"recall_at_5": round(r5 / len(queries), 3), "mrr": round(mrr / len(queries), 3),
            "p50_ms": round(statistics.median(times), 1),
            "p95_ms": round(percentile(times, 95), 1),
            "scope_docs": docs[0], "table_docs": docs[1], "queries": len(queries)}


async def layout(admin: str, name: str, scopes: list[str], per_scope: int,
                 repeat: int) -> dict[str, Any]:
    """The corpus in scopes[0], `per_scope` filler documents in every scope."""
    url = fresh_database(admin, f"bench_scopes_{name}")
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-"))
    try:
        ctx = make_ctx(tmp, url).scoped(scopes[0])
        ctx.vault.ensure()
        queries = await load_corpus(ctx)
        t0 = time.perf_counter()
        for i, scope in enumerate(scopes):
            await bulk_index(url, filler_docs(per_scope, seed=7 + i), scope=scope)
        load_s = time.perf_counter() - t0
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("ANALYZE memory_docs")
        figures = await measure(url, scopes[0], queries, repeat)
        figures.update(layout=name, scopes=len(scopes), load_s=round(load_s, 1))
        return figures
    finally:
        await close_pools()
        shutil.rmtree(tmp, ignore_errors=True)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--per-scope", type=int, default=10_000)
    p.add_argument("--scopes", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    started = time.perf_counter()
    commit = source_commit()  # the code measured, not whatever is checked out at the end
    total = args.per_scope * args.scopes
    with temporary_postgres("keel-bench-pg-") as admin:
        layouts = [
            await layout(admin, "one-scope", ["default"], total, args.repeat),
            await layout(admin, "many-scopes", [f"s{i}" for i in range(args.scopes)],
                         args.per_scope, args.repeat),
            await layout(admin, "one-small-scope", ["default"], args.per_scope, args.repeat),
        ]
    out: dict[str, Any] = {
        "benchmark": "scopes",
        "machine": {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                    "cpus": os.cpu_count(), "python": platform.python_version(),
                    "commit": commit},
        "per_scope": args.per_scope, "scopes": args.scopes, "repeat": args.repeat,
        "layouts": layouts, "total_seconds": round(time.perf_counter() - started, 1),
    }
    print(table("Search by memory scope (corpus queries, k=5, BM25 + graph rerank)",
                ["layout", "docs in scope", "docs in table", "recall@5", "MRR", "p50 ms",
                 "p95 ms", "load s"],
                [[f["layout"], f"{f['scope_docs']:,}", f"{f['table_docs']:,}",
                  f["recall_at_5"], f["mrr"], f["p50_ms"], f["p95_ms"], f["load_s"]]
                 for f in layouts]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    default = (args.per_scope, args.scopes, args.repeat) == (10_000, 10, 3)
    path = RESULTS / ("scopes.json" if default else "scopes-custom.json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"total {out['total_seconds']} s at commit {out['machine']['commit']}; figures "
          f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    asyncio.run(main())
