"""Searches in other languages: does long memory find what was said in Spanish, German,
Russian, Greek, Turkish, Romanian, Arabic, Hindi, Vietnamese, Thai, Chinese?

    git clone https://github.com/google-deepmind/xquad /tmp/xquad
    .venv/bin/python bench/bench_languages.py --data /tmp/xquad

XQuAD (Artetxe et al., 2020; CC BY-SA 4.0) is 240 paragraphs of English Wikipedia and
1,190 questions about them, translated by professionals into ten languages (Romanian
later): the same questions over the same facts in every language, so the languages can be
compared with one another and with English. Every paragraph is a note (its text, no
title) in its language's own scope, and every question is searched there; a hit is the
question's own paragraph among the first k. Then all the languages' notes in one scope
(2,880 documents: a vault whose user writes in several languages), each question searched
there, a hit only its own paragraph in its own language.

Ranked two ways (k=10): plain BM25 (bench_recall's: lower-cased `\\w+` words, the
reference), and Keel's search (BM25 + graph, no embedder, no spelling correction: what a
turn's recall ranks by). Reported per language: hit@1, hit@5, hit@10, MRR and the median
time of a search. Written to bench/results/languages.json (`--out NAME`: NAME.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from activities.vault.bulk import index_bulk
from activities.vault.search import IndexDoc, search
from bench.bench_memory import fresh_database
from bench.bench_recall import RESULTS, K, _load, plain_bm25
from bench.common import source_commit, table
from keel.devstack import temporary_postgres

LANGUAGES = ("en", "es", "de", "ru", "el", "tr", "ro", "ar", "hi", "vi", "th", "zh")


def load(folder: Path, lang: str) -> tuple[list[IndexDoc], list[tuple[str, str]]]:
    """One language's paragraphs as notes, and its questions with their paragraph's path."""
    data = json.loads((folder / f"xquad.{lang}.json").read_text(encoding="utf-8-sig"))
    docs: list[IndexDoc] = []
    questions: list[tuple[str, str]] = []
    for a, article in enumerate(data["data"]):
        for p, para in enumerate(article["paragraphs"]):
            path = f"notes/xquad-{lang}-{a:02d}-{p:02d}.md"
            docs.append(IndexDoc(path=path, kind="note", body=para["context"].strip("\ufeff")))
            questions += [(qa["question"], path) for qa in para["qas"]]
    return docs, questions


def tally(ranks: list[int | None], ms: list[float]) -> dict[str, float]:
    n = max(len(ranks), 1)
    return {"hit1": round(sum(1 for r in ranks if r == 1) / n, 4),
            "hit5": round(sum(1 for r in ranks if r and r <= 5) / n, 4),
            "hit10": round(sum(1 for r in ranks if r) / n, 4),
            "mrr": round(sum(1 / r for r in ranks if r) / n, 4),
            **({"p50_ms": round(statistics.median(ms), 2)} if ms else {})}


def rank_of(ranked: list[str], want: str) -> int | None:
    return next((i for i, p in enumerate(ranked[:K], start=1) if p == want), None)


async def keel_ranks(conn: psycopg.AsyncConnection[Any], questions: list[tuple[str, str]],
                     scope: str) -> tuple[list[int | None], list[float]]:
    ranks: list[int | None] = []
    ms: list[float] = []
    for question, want in questions:
        t0 = time.perf_counter()
        hits = await search(conn, question, scope=scope, k=K, spelling=False)
        ms.append((time.perf_counter() - t0) * 1000)
        ranks.append(rank_of([h.path for h in hits], want))
    return ranks, ms


async def run(url: str, folder: Path, langs: list[str]) -> dict[str, Any]:
    data = {lang: load(folder, lang) for lang in langs}
    out: dict[str, Any] = {}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        t0 = time.perf_counter()
        for lang, (docs, _) in data.items():
            await index_bulk(conn, docs, scope=f"xquad-{lang}")
            await index_bulk(conn, docs, scope="xquad-all")
        index_s = time.perf_counter() - t0
        # Settled before anything is timed: the load's rows get their hint bits and
        # visibility here, not in the first language's searches, and no autovacuum of the
        # load runs beside them (English, measured first, moved 10-15 ms between runs).
        await conn.execute("VACUUM (ANALYZE)")
        for lang, (docs, questions) in data.items():
            rank = plain_bm25({d.path: d.body for d in docs}, {d.path: d.path for d in docs})
            plain = [rank_of(rank(q), want) for q, want in questions]
            own = await keel_ranks(conn, questions, f"xquad-{lang}")
            mixed = await keel_ranks(conn, questions, "xquad-all")
            out[lang] = {"documents": len(docs), "questions": len(questions),
                         "plain BM25": tally(plain, []), "keel": tally(*own),
                         "keel, all languages in one scope": tally(*mixed)}
            print(f"  {lang}: plain {out[lang]['plain BM25']['hit1']:.3f} "
                  f"keel {out[lang]['keel']['hit1']:.3f} (hit@1)", flush=True)
    return {"index_s": round(index_s, 1), "languages": out}


def report(figures: dict[str, Any]) -> None:
    rows = []
    for lang, f in figures["languages"].items():
        rows.append([lang, str(f["questions"])] + [
            f"{100 * f[m]['hit1']:.1f} / {100 * f[m]['hit5']:.1f} / {100 * f[m]['hit10']:.1f}"
            for m in ("plain BM25", "keel", "keel, all languages in one scope")]
            + [f"{f['keel']['p50_ms']:.1f}"])
    print(table("XQuAD, hit@1 / hit@5 / hit@10 (%)",
                ["language", "questions", "plain BM25", "Keel", "Keel, one scope of all",
                 "Keel p50 ms"], rows))


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a clone of google-deepmind/xquad")
    p.add_argument("--langs", default=",".join(LANGUAGES))
    p.add_argument("--out", default=None, help="write results/NAME.json instead")
    args = p.parse_args()
    langs = [x for x in args.langs.split(",") if x]
    commit = source_commit()  # the code measured: read before the run
    with temporary_postgres("keel-bench-pg-") as admin:
        url = fresh_database(admin, "keel_bench_languages")
        load_before = _load()
        figures = await run(url, args.data, langs)
        figures["load"] = load_before + _load()
    report(figures)
    name = args.out or "languages"
    (RESULTS / f"{name}.json").write_text(json.dumps({
        "benchmark": "languages (XQuAD: one note a paragraph, its questions searched)",
        "machine": {"date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
                    "cpus": os.cpu_count(), "commit": commit},
        "k": K, **figures}, indent=1) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
