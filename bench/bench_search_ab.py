"""The BM25 statement of another commit against this one's, question by question, in turn.

    .venv/bin/python bench/bench_search_ab.py --base a9af187 --xquad /tmp/xquad
    .venv/bin/python bench/bench_search_ab.py --base a9af187 --realtalk /tmp/realtalk/data \\
        --size 100000

A search's time moves a lot between runs of a whole benchmark on a shared machine (the
hour's load, what the server has cached); two statements timed in turn, on one database,
over the same questions, see the same machine. Only the statement's text is swapped
(`activities.vault.bm25._BM25`, read from `git show BASE:activities/vault/bm25.py`):
everything else a search does is this commit's, so the base's statement must take this
one's parameters (a base whose statement does not fails at its first question, saying
so). Each question is searched by both, their order alternating; every question twice.

Sets: XQuAD's paragraphs as notes, a scope per language (`--xquad`, `--langs`), and
REALTALK's messages with generated filler up to `--size` documents in one scope
(`--realtalk`). Reported per set: p50 and p95 of each, their ratios, and whether the two
ranked alike (the same paths in the same order for every question). Written to
bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

import activities.vault.bm25 as bm25_module  # noqa: E402
from activities.vault.bulk import index_bulk  # noqa: E402
from activities.vault.search import IndexDoc, search  # noqa: E402
from bench.bench_languages import load  # noqa: E402
from bench.bench_memory import filler_docs, fresh_database  # noqa: E402
from bench.bench_recall import RESULTS, _load, load_conversations  # noqa: E402
from bench.common import percentile, source_commit, table  # noqa: E402
from keel.devstack import temporary_postgres  # noqa: E402

K = 10


def base_statement(rev: str) -> str:
    """The BM25 statement as commit `rev` wrote it."""
    source = subprocess.run(["git", "show", f"{rev}:activities/vault/bm25.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    namespace: dict[str, Any] = {"__name__": "bm25_base"}
    exec(compile(source, f"{rev}:activities/vault/bm25.py", "exec"), namespace)
    statement = namespace.get("_BM25")
    if not isinstance(statement, str):
        raise SystemExit(f"{rev}'s bm25.py has no _BM25 statement")
    return statement


async def in_turn(conn: psycopg.AsyncConnection[Any], questions: list[str], scope: str,
                  statements: dict[str, str]) -> dict[str, Any]:
    times: dict[str, list[float]] = {name: [] for name in statements}
    differ = 0
    for n, question in enumerate(questions * 2):
        order = list(statements) if n % 2 else list(reversed(statements))
        ranked: dict[str, list[str]] = {}
        for name in order:
            bm25_module._BM25 = statements[name]
            t0 = time.perf_counter()
            hits = await search(conn, question, scope=scope, k=K, spelling=False)
            times[name].append((time.perf_counter() - t0) * 1000)
            ranked[name] = [h.path for h in hits]
        differ += len({tuple(r) for r in ranked.values()}) > 1
    out: dict[str, Any] = {"questions": len(questions), "searches_each": 2 * len(questions),
                           "ranked_alike": differ == 0, "questions_ranked_differently": differ}
    for name, ms in times.items():
        out[name] = {"p50_ms": round(statistics.median(ms), 2),
                     "p95_ms": round(percentile(ms, 95), 2)}
    a, b = list(statements)
    out["ratio_p50"] = round(out[b]["p50_ms"] / out[a]["p50_ms"], 3)
    out["ratio_p95"] = round(out[b]["p95_ms"] / out[a]["p95_ms"], 3)
    return out


async def run(url: str, args: argparse.Namespace,
              statements: dict[str, str]) -> dict[str, Any]:
    sets: dict[str, Any] = {}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        if args.xquad:
            for lang in [x for x in args.langs.split(",") if x]:
                docs, questions = load(args.xquad, lang)
                await index_bulk(conn, docs, scope=f"xquad-{lang}")
                await conn.execute("VACUUM ANALYZE memory_docs")
                sets[f"xquad-{lang}"] = await in_turn(
                    conn, [q for q, _ in questions], f"xquad-{lang}", statements)
                print(f"  xquad-{lang}: {sets[f'xquad-{lang}']['ratio_p50']}x", flush=True)
        if args.realtalk:
            convs = load_conversations(args.realtalk)
            own: list[IndexDoc] = [d for c in convs for d in c["docs"]]
            docs = own + filler_docs(max(0, args.size - len(own)), seed=11)
            await index_bulk(conn, docs, scope="realtalk")
            await conn.execute("VACUUM ANALYZE")
            name = f"realtalk-{len(docs)}"
            sets[name] = await in_turn(conn, [q for c in convs for q, _ in c["questions"]],
                                       "realtalk", statements)
            print(f"  {name}: {sets[name]['ratio_p50']}x", flush=True)
    return sets


def report(sets: dict[str, Any], a: str, b: str) -> None:
    rows = [[name, str(s["questions"]), f"{s[a]['p50_ms']} / {s[a]['p95_ms']}",
             f"{s[b]['p50_ms']} / {s[b]['p95_ms']}", f"{s['ratio_p50']} / {s['ratio_p95']}",
             "yes" if s["ranked_alike"] else f"no ({s['questions_ranked_differently']})"]
            for name, s in sets.items()]
    print(table("BM25 statement in turn, p50 / p95 ms", ["set", "questions", a, b,
                                                          "after / before", "ranked alike"],
                rows))


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the commit whose statement is 'before'")
    p.add_argument("--xquad", type=Path, default=None, help="a clone of google-deepmind/xquad")
    p.add_argument("--langs", default="en,es,de,ru,el,tr,ro,ar,hi,vi,th,zh")
    p.add_argument("--realtalk", type=Path, default=None, help="REALTALK's data/ folder")
    p.add_argument("--size", type=int, default=100_000, help="REALTALK's scope, filled to this")
    p.add_argument("--out", default="search-ab", help="results file name in bench/results")
    args = p.parse_args()
    if not args.xquad and not args.realtalk:
        p.error("give --xquad, --realtalk or both")
    commit = source_commit()
    base = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    a, b = f"before ({base})", f"after ({commit})"
    statements = {a: base_statement(args.base), b: bm25_module._BM25}
    with temporary_postgres("keel-bench-pg-") as admin:
        url = fresh_database(admin, "keel_bench_search_ab")
        load_before = _load()
        sets = await run(url, args, statements)
        load_after = _load()
    report(sets, a, b)
    (RESULTS / f"{args.out}.json").write_text(json.dumps({
        "benchmark": "search A/B: the BM25 statement of two commits, in turn, per question",
        "machine": {"date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
                    "cpus": os.cpu_count(), "commit": commit, "base": base,
                    "load": load_before + load_after},
        "k": K, "sets": sets}, indent=1) + "\n")
    print(f"written to bench/results/{args.out}.json")


if __name__ == "__main__":
    asyncio.run(main())
