"""Figures for long memory: search quality, search latency, and what a weekly summary costs.

    .venv/bin/python bench/bench_memory.py [--sizes 10000,100000] [--repeat 3]

1. Search quality on the built-in corpus (tests/vault/fixtures/search_corpus: English and Russian
   queries with known answers): recall@5 and MRR, BM25 alone and with the graph rerank,
   on the corpus alone and buried among synthetic filler documents.
2. Search latency (p50 / p95 of a recall query) with 10,000 and 100,000 documents indexed.
3. The cost of a weekly summary against its seven raw days, in tokens, made by the offline
   rollup rules through the real rollup activities (beside the seed's "about 1/35th").

It starts its own embedded PostgreSQL in a temporary folder; nothing is downloaded. It is
not a test and may take a few minutes at 100,000 documents. The search figures (1 and 2)
are also written to bench/results/memory-search.json with the commit measured
(memory-search-custom.json for other --sizes / --repeat).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from activities.db import apply_migrations, close_pools
from activities.offline import rollup as offline_rollup
from activities.vault.rollup import RollupActivities, RollupStepInput
from activities.vault.search import _UPSERT, IndexDoc, doc_params, rebuild_statistics, search
from bench.common import source_commit
from keel.devstack import temporary_postgres
from schemas.config import ModelSettings
from schemas.tokens import count_tokens
from schemas.vault.rollup import RollupKind, transcript_entry
from schemas.vault.search import recall_at_k, reciprocal_rank
from tests.fake_anthropic import FakeAnthropic
from tests.vault.support import CORPUS, load_corpus, make_ctx
from workers.worker import model_backends

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "memory-search.json"

EN_SYL = ["ka", "ro", "mi", "ten", "lo", "var", "es", "di", "pra", "ul", "son", "che", "ba",
          "nor", "fi", "gal", "tru", "ve", "op", "lin"]
RU_SYL = ["ка", "ро", "ми", "тен", "ло", "вар", "ес", "ди", "пра", "ул", "сон", "че", "ба",
          "нор", "фи", "гал", "тру", "ве", "оп", "лин"]


def vocabulary(rng: random.Random, size: int) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        syl = EN_SYL if rng.random() < 0.5 else RU_SYL
        words.add("".join(rng.choice(syl) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def corpus_words() -> list[str]:
    words: list[str] = []
    for path in sorted((CORPUS / "vault").rglob("*.md")):
        words += re.findall(r"\w+", path.read_text().split("---\n")[-1])
    return words


def filler_docs(n: int, seed: int = 7) -> list[IndexDoc]:
    """Synthetic documents with a Zipf-like word distribution, some common English and
    Russian words (so the queries' common terms have realistic document frequencies), and,
    in one document of five, a handful of words taken from the corpus itself: distractors
    that share the answers' words without being the answers."""
    rng = random.Random(seed)
    topical = corpus_words()
    vocab = vocabulary(rng, 30_000)
    # Cumulative weights, summed once (random.choices would sum all 30,000 on every call:
    # minutes at 100,000 documents); the documents are the same.
    cum_weights = list(itertools.accumulate(1.0 / (i + 1) for i in range(len(vocab))))
    common = ("the a of to in is on for with and at by it we that this is was "
              "и в на с по что это как не для от у о за из").split()
    docs = []
    for i in range(n):
        length = rng.randint(40, 250)
        words = rng.choices(vocab, cum_weights=cum_weights, k=length)
        words += rng.choices(common, k=length // 4)
        if rng.random() < 0.2:
            words += rng.choices(topical, k=rng.randint(3, 12))
        rng.shuffle(words)
        kind = rng.choice(["card", "daily", "summary"])
        docs.append(IndexDoc(path=f"filler/{kind}/{i}.md", kind=kind,
                             title=" ".join(words[:3]), body=" ".join(words),
                             card_key=f"filler {i}" if kind == "card" else None))
    return docs


async def bulk_index(url: str, docs: list[IndexDoc], scope: str = "default") -> None:
    """Index without the per-row statistics triggers, then recount once (a bulk load)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("SET session_replication_role = replica")
        async with conn.cursor() as cur:
            for start in range(0, len(docs), 2_000):
                batch = docs[start:start + 2_000]
                params = [doc_params(d, scope=scope) for d in batch]
                await cur.executemany(_UPSERT, params)
        await conn.execute("SET session_replication_role = origin")
        await rebuild_statistics(conn, scope=scope)
        await conn.execute("ANALYZE memory_docs")


async def quality(ctx, queries: list[dict], use_graph: bool) -> tuple[float, float]:
    pool = await ctx.pool()
    r5 = mrr = 0.0
    async with pool.connection() as conn:
        for q in queries:
            paths = [h.path for h in await search(conn, q["query"], scope="default", k=10,
                                                  use_graph=use_graph)]
            r5 += recall_at_k(paths, set(q["relevant"]))
            mrr += reciprocal_rank(paths, set(q["relevant"]))
    return r5 / len(queries), mrr / len(queries)


async def latency(ctx, queries: list[dict], use_graph: bool, repeat: int) -> tuple[float, float]:
    pool = await ctx.pool()
    times = []
    async with pool.connection() as conn:
        for _ in range(repeat):
            for q in queries:
                t0 = time.perf_counter()
                await search(conn, q["query"], scope="default", k=5, use_graph=use_graph)
                times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95) - 1]


def quality_rows(label: str, en_ru: dict[str, tuple[float, float]]) -> list[str]:
    return [f"| {label} | {k} | {v[0]:.3f} | {v[1]:.3f} |" for k, v in en_ru.items()]


async def search_figures(admin_url: str, sizes: list[int], repeat: int) -> dict:
    print("## Search\n")
    print("| indexed documents | ranking | recall@5 | MRR | p50 ms | p95 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    figures: dict = {"search": [], "languages": {}}
    for size in [0, *sizes]:
        url = fresh_database(admin_url, f"bench_search_{size}")
        tmp = Path(tempfile.mkdtemp(prefix="keel-bench-"))
        ctx = make_ctx(tmp, url)
        ctx.vault.ensure()
        queries = await load_corpus(ctx)
        if size:
            t0 = time.perf_counter()
            await bulk_index(url, filler_docs(size))
            load_s = time.perf_counter() - t0
        async with await psycopg.AsyncConnection.connect(url) as conn:
            stats = await (await conn.execute(
                "SELECT n_docs FROM memory_stats WHERE scope = 'default'")).fetchone()
            assert stats is not None  # the corpus is loaded: its scope has its row
            n = stats[0]
        for use_graph, label in ((False, "BM25 alone"), (True, "BM25 + graph rerank")):
            r5, mrr = await quality(ctx, queries, use_graph)
            p50, p95 = await latency(ctx, queries, use_graph, repeat)
            print(f"| {n:,} | {label} | {r5:.3f} | {mrr:.3f} | {p50:.1f} | {p95:.1f} |")
            figures["search"].append({
                "documents": n, "ranking": label, "recall_at_5": round(r5, 3),
                "mrr": round(mrr, 3), "p50_ms": round(p50, 1), "p95_ms": round(p95, 1)})
        if size:
            print(f"|  | (bulk load of {size:,} filler documents: {load_s:.0f} s) | | | | |")
        await close_pools()
        shutil.rmtree(tmp, ignore_errors=True)
    for lang in ("en", "ru"):
        url = fresh_database(admin_url, f"bench_lang_{lang}")
        tmp = Path(tempfile.mkdtemp(prefix="keel-bench-"))
        ctx = make_ctx(tmp, url)
        ctx.vault.ensure()
        queries = [q for q in await load_corpus(ctx) if q["lang"] == lang]
        alone = await quality(ctx, queries, False)
        graph = await quality(ctx, queries, True)
        print(f"\n{lang}: {len(queries)} queries; BM25 alone recall@5 {alone[0]:.3f} MRR "
              f"{alone[1]:.3f}; with graph recall@5 {graph[0]:.3f} MRR {graph[1]:.3f}")
        figures["languages"][lang] = {
            "queries": len(queries),
            "bm25": {"recall_at_5": round(alone[0], 3), "mrr": round(alone[1], 3)},
            "graph": {"recall_at_5": round(graph[0], 3), "mrr": round(graph[1], 3)}}
        await close_pools()
        shutil.rmtree(tmp, ignore_errors=True)
    return figures


PEOPLE = ["Anna Petrova", "Boris Ivanov", "Carl Weber", "Dana Kim", "Ольга Смирнова"]
ORGS = ["TDI Group", "Acme Corp", "Globex", "Альфа Логистик"]
TOPICS = ["the billing migration", "the warehouse scanners", "the quarterly report",
          "the API rate limits", "the onboarding guide", "the search index", "the invoice run",
          "the holiday plan", "the release checklist", "the customer interviews"]
ACTIONS = ["reviewed", "rewrote", "tested", "discussed", "planned", "fixed", "measured",
           "documented", "postponed", "shipped"]


def week_of_transcripts(vault, start: date, per_day: int, seed: int = 3) -> dict[date, int]:
    """Seven days of plausible varied work chat (user and assistant), their token counts."""
    rng = random.Random(seed)
    sizes = {}
    for d in range(7):
        day = start + timedelta(days=d)
        text = f"# {day}\n"
        for n in range(per_day):
            at = datetime(day.year, day.month, day.day, 8, 0, tzinfo=UTC) + timedelta(minutes=7 * n)
            topic, action = rng.choice(TOPICS), rng.choice(ACTIONS)
            person, org = rng.choice(PEOPLE), rng.choice(ORGS)
            said = (f"We {action} {topic} with {person} this morning; the numbers moved from "
                    f"{rng.randint(10, 99)} to {rng.randint(10, 99)} and {person.split()[0]} "
                    f"wants a follow-up by {rng.choice(['Monday', 'Friday', 'next week'])}.")
            if rng.random() < 0.05:
                said = f"{person} works at {org}. " + said
            if rng.random() < 0.04:
                said = f"We decided to {rng.choice(ACTIONS[:5])} {topic} first. " + said
            reply = (f"Understood. I {action} {topic} again: the open points are the data "
                     f"export ({rng.randint(1, 9)} items), the test plan and the sign-off from "
                     f"{person}. I will prepare a short note with the figures and the risks, "
                     f"and keep the previous version for comparison.")
            text += transcript_entry("bench", d * 1000 + 2 * n, at, "user", said)
            text += transcript_entry("bench", d * 1000 + 2 * n + 1, at, "assistant", reply)
        vault.write(f"daily/{day}.md", text)
        sizes[day] = count_tokens(text)
    return sizes


def rollup_reply(request: dict[str, Any]) -> dict[str, Any]:
    """The offline rollup's reply: the weekly figures send the model nothing else."""
    reply = offline_rollup.respond(request)
    assert reply is not None, "a request that is no rollup"
    return reply


async def weekly_figures(admin_url: str, per_day: int) -> None:
    print("\n## A weekly summary against its seven raw days\n")
    url = fresh_database(admin_url, "bench_weekly")
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-"))
    fake = FakeAnthropic(rollup_reply).start()
    try:
        ctx = make_ctx(tmp, url, ModelSettings(base_url=fake.base_url, api_key="bench"))
        ctx.vault.ensure()
        start = date(2026, 6, 7)
        raw = week_of_transcripts(ctx.vault, start, per_day)
        acts = RollupActivities(ctx, model_backends())
        daily_tokens = 0
        for d in range(7):
            step = RollupStepInput(kind=RollupKind.DAILY, period=str(start + timedelta(days=d)))
            await acts.plan_rollup(step)
            result = await acts.apply_rollup(step)
            daily_tokens += count_tokens(ctx.vault.path(result.summary_path).read_text())
        step = RollupStepInput(kind=RollupKind.WEEKLY, period=str(start))
        await acts.plan_rollup(step)
        result = await acts.apply_rollup(step)
        weekly_file = count_tokens(ctx.vault.path(result.summary_path).read_text())
        total = sum(raw.values())
        print(f"- seven raw days (daily/*.md, word for word, replies included): {total:,} "
              f"tokens ({total // 7:,} a day, {per_day} exchanges a day)")
        print(f"- seven daily summaries: {daily_tokens:,} tokens (1/{total / daily_tokens:.0f})")
        print(f"- the weekly summary file: {weekly_file:,} tokens, summary text "
              f"{result.summary_tokens:,} tokens")
        print(f"- weekly / raw week: 1/{total / weekly_file:.0f} (file), "
              f"1/{total / max(1, result.summary_tokens):.0f} (summary text); "
              "the seed says about 1/35")
        print("- made by the offline rollup rules (extractive), not a language model")
    finally:
        fake.stop()
        await close_pools()
        shutil.rmtree(tmp, ignore_errors=True)


def fresh_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin_url.replace("/postgres?", f"/{name}?")
    apply_migrations(url)
    return url


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--per-day", type=int, default=40, help="exchanges a day")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print(f"# Keel long-memory figures ({datetime.now(UTC):%Y-%m-%d}, "
          f"{os.cpu_count()} CPUs, embedded PostgreSQL)\n")
    commit = source_commit()  # the code measured: read before the run
    with temporary_postgres("keel-bench-pg-") as admin:
        figures = await search_figures(admin, sizes, args.repeat)
        path = (RESULTS if (args.sizes, args.repeat) == ("10000,100000", 3)
                else RESULTS.with_name("memory-search-custom.json"))
        path.write_text(json.dumps({
            "benchmark": "memory-search",
            "machine": {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                        "cpus": os.cpu_count(), "python": platform.python_version(),
                        "commit": commit},
            "sizes": sizes, "repeat": args.repeat, **figures}, indent=2) + "\n")
        print(f"\nsearch figures written to {path.relative_to(ROOT)} at commit {commit}")
        await weekly_figures(admin, args.per_day)

if __name__ == "__main__":
    asyncio.run(main())
