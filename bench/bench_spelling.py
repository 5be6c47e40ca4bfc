"""Misspelt searches: does long memory still find what was said?

    .venv/bin/python bench/bench_spelling.py --data PATH/TO/REALTALK/data
    .venv/bin/python bench/bench_spelling.py --data PATH/TO/REALTALK/data --heldout

The data and the scopes are bench_recall's (REALTALK's conversations, one scope each, a
message a daily-transcript entry; `--heldout`: the LoCoMo copy instead). Every question is
asked as written and once misspelt: its rarest word of five letters or more (the highest
IDF in its conversation: the word a search leans on most) changed by a typo of one kind,
the kinds taken in turn, seeded by the question's number: two neighbouring letters
swapped, a letter dropped, a letter doubled, a letter replaced by its neighbour on a QWERTY
keyboard (Damerau's four single edits, about four typos in five), and two edits at once (a
swap and a drop: the corrector's known limit, reported on its own). The misspelt word is
always one the conversation lacks, so a hit for it can come only from its correction.
Those typos are made here; as an instrument the correction was not tuned on, the
questions are asked once more with a misspelling people really wrote: the rarest of the
question's words that codespell's list (its `dictionary.txt`, ~65,000 misspellings seen in
code and prose, each with its one correction) misspells, replaced by one of its listed
misspellings ("real typo"; some are two or more edits away).

Ranked three ways (k=10): plain BM25 (bench_recall's, the reference), Keel's search (BM25
+ graph, no embedder) with the spelling correction off, and on. Reported per kind: turn
hit@10 and MRR, session hit@10, and how often the correction named the word the question
had (`restored`). Then latency: `search` with the correction off and on, for the clean and
the misspelt questions, in the conversations' scopes and in one scope of `--size`
documents (every conversation's messages among bench_recall's filler: a vocabulary of
~30,000 more words). Written to bench/results/spelling.json (spelling-heldout.json).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.resources
import json
import math
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from activities.vault.bulk import index_bulk
from activities.vault.search import search
from bench.bench_memory import filler_docs, fresh_database
from bench.bench_recall import (
    _WORD,
    RESULTS,
    K,
    Tally,
    _load,
    cpu_clock,
    load_conversations,
    load_locomo,
    plain_bm25,
)
from bench.common import percentile, source_commit, table
from keel.devstack import temporary_postgres
from schemas.vault.spelling import one_edit

KINDS = ("swapped", "dropped", "doubled", "neighbour key", "two edits")
REAL = "real typo (codespell)"
_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
_KEY = {ch: row[i + 1] if i + 1 < len(row) else row[i - 1]
        for row in _ROWS for i, ch in enumerate(row)}


def misspell(word: str, kind: str, rng: random.Random) -> str:
    """`word` with one typo of `kind` inside it (the first and last letters kept)."""
    inner = list(range(1, len(word) - 1))
    rng.shuffle(inner)
    for i in inner:
        if kind == "swapped" and i + 1 < len(word) - 1 and word[i] != word[i + 1]:
            return word[:i] + word[i + 1] + word[i] + word[i + 2:]
        if kind == "dropped":
            return word[:i] + word[i + 1:]
        if kind == "doubled":
            return word[:i] + word[i] + word[i:]
        if kind == "neighbour key" and word[i] in _KEY:
            return word[:i] + _KEY[word[i]] + word[i + 1:]
        if kind == "two edits":
            swapped = misspell(word, "swapped", rng)
            return misspell(swapped, "dropped", rng) if swapped != word else word
    return word


def misspelt_questions(conv: dict[str, Any], first: int) -> list[dict[str, Any]]:
    """Each question of `conv` whose rarest long word can be misspelt into a word the
    conversation lacks: the question, its typo's kind, the word and the typo."""
    toks = [set(_WORD.findall(t.lower())) for t in conv["texts"].values()]
    df = collections.Counter(w for t in toks for w in t)
    out = []
    for n, (question, evidence) in enumerate(conv["questions"], start=first):
        words = [w for w in dict.fromkeys(_WORD.findall(question.lower()))
                 if len(w) >= 5 and w.isalpha() and df[w]]
        if not words:
            continue
        word = max(words, key=lambda w: (math.log(len(toks) / df[w]), w))
        kind = KINDS[n % len(KINDS)]
        typo = misspell(word, kind, random.Random(n))
        if typo == word or df[typo]:
            continue
        at = question.lower().index(word)
        out.append({"question": question[:at] + typo + question[at + len(word):],
                    "clean": question, "evidence": evidence, "kind": kind, "word": word,
                    "typo": typo})
    return out


def real_typos() -> dict[str, list[str]]:
    """codespell's misspellings by the word they misspell: lower-case words of letters
    with exactly one correction."""
    text = (importlib.resources.files("codespell_lib") / "data" / "dictionary.txt"
            ).read_text(encoding="utf-8")
    out: dict[str, list[str]] = collections.defaultdict(list)
    for line in text.splitlines():
        typo, _, fixes = line.partition("->")
        fix = [f.strip() for f in fixes.split(",") if f.strip()]
        if len(fix) == 1 and typo.isalpha() and fix[0].isalpha() and typo.islower() \
                and fix[0].islower():
            out[fix[0]].append(typo)
    return {word: sorted(typos) for word, typos in out.items()}


def really_misspelt(conv: dict[str, Any], first: int, typos: dict[str, list[str]]
                    ) -> list[dict[str, Any]]:
    """Each question of `conv` with its rarest word that codespell misspells replaced by
    one of those misspellings (one the conversation lacks), chosen by the question's
    number."""
    toks = [set(_WORD.findall(t.lower())) for t in conv["texts"].values()]
    df = collections.Counter(w for t in toks for w in t)
    out = []
    for n, (question, evidence) in enumerate(conv["questions"], start=first):
        words = [w for w in dict.fromkeys(_WORD.findall(question.lower()))
                 if df[w] and any(not df[t] for t in typos.get(w, ()))]
        if not words:
            continue
        word = max(words, key=lambda w: (math.log(len(toks) / df[w]), w))
        options = [t for t in typos[word] if not df[t]]
        typo = options[n % len(options)]
        at = question.lower().index(word)
        out.append({"question": question[:at] + typo + question[at + len(word):],
                    "clean": question, "evidence": evidence, "kind": REAL, "word": word,
                    "typo": typo})
    return out


async def ranked(conn: Any, question: str, scope: str, spelling: bool,
                 ms: list[float]) -> tuple[list[str], dict[str, str]]:
    t0 = time.perf_counter()
    hits = await search(conn, question, scope=scope, k=K, spelling=spelling)
    ms.append((time.perf_counter() - t0) * 1000)
    return [h.path for h in hits], hits.corrected


class Run:
    """The tallies of one run: per (what was asked, ranking), and the latencies."""

    def __init__(self) -> None:
        self.tallies: dict[tuple[str, str], Tally] = collections.defaultdict(Tally)
        self.restored: collections.Counter[str] = collections.Counter()
        self.asked: collections.Counter[str] = collections.Counter()
        self.one_edit: collections.Counter[str] = collections.Counter()
        self.ms: dict[str, list[float]] = collections.defaultdict(list)

    async def ask(self, conn: Any, rank: Any, conv: dict[str, Any], scope: str,
                  q: dict[str, Any]) -> None:
        """One question as written and misspelt, ranked three ways."""
        self.asked[q["kind"]] += 1
        self.one_edit[q["kind"]] += q["typo"] in one_edit(q["word"])
        asked = [(f"{q['kind']}, as written", q["clean"]), (q["kind"], q["question"])]
        if q["kind"] != REAL:
            asked.insert(0, ("as written", q["clean"]))
        for kind, text in asked:
            self.tallies[(kind, "plain BM25")].add(rank(text), q["evidence"],
                                                   conv["session_of"])
            for on in (False, True):
                label = "spelling on" if on else "spelling off"
                typed = "as written" if text is q["clean"] else "misspelt"
                got, corrected = await ranked(conn, text, scope, on,
                                              self.ms[f"{label}, {typed}"])
                self.tallies[(kind, f"keel, {label}")].add(got, q["evidence"],
                                                          conv["session_of"])
                if on and typed == "misspelt":
                    self.restored[q["kind"]] += corrected.get(q["typo"]) == q["word"]

    def summary(self) -> dict[str, Any]:
        by_kind: dict[str, dict[str, Any]] = {}
        made = sum(n for kind, n in self.asked.items() if kind != REAL)
        for (kind, mode), tally in sorted(self.tallies.items()):
            s = tally.summary()
            base = kind.removesuffix(", as written")
            by_kind.setdefault(kind, {"questions": self.asked.get(base, made)})[mode] = {
                k: s[k] for k in ("turn_hit10", "turn_mrr", "session_hit10")}
        for kind, n in self.asked.items():
            by_kind[kind]["restored"] = round(self.restored[kind] / n, 4)
            by_kind[kind]["one_edit_share"] = round(self.one_edit[kind] / n, 4)
        return {"questions": made, "real_typo_questions": self.asked[REAL],
                "by_kind": by_kind,
                "latency_ms": {k: {"p50": round(statistics.median(v), 2),
                                   "p95": round(percentile(v, 95), 2)}
                               for k, v in self.ms.items()}}


async def quality(url: str, convs: list[dict[str, Any]]) -> dict[str, Any]:
    typos, run, first = real_typos(), Run(), 0
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for i, conv in enumerate(convs):
            await index_bulk(conn, conv["docs"], scope=f"rt{i}", embedder=None)
        await conn.execute("ANALYZE")
        for i, conv in enumerate(convs):
            rank = plain_bm25(conv["texts"], conv["paths"])
            for q in misspelt_questions(conv, first) + really_misspelt(conv, first, typos):
                await run.ask(conn, rank, conv, f"rt{i}", q)
            first += len(conv["questions"])
    return run.summary()


async def latency_at(admin: str, convs: list[dict[str, Any]], size: int) -> dict[str, Any]:
    """Search latency with the correction off and on in one scope of `size` documents."""
    url = fresh_database(admin, f"bench_spelling_{size}")
    own = [d for c in convs for d in c["docs"]]
    docs = own + filler_docs(max(0, size - len(own)), seed=11)
    questions = [q for first, c in enumerate(convs) for q in misspelt_questions(c, first * 1000)]
    out: dict[str, Any] = {"documents": len(docs), "questions": len(questions)}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await index_bulk(conn, docs, scope="default", embedder=None)
        await conn.execute("VACUUM ANALYZE")
        row = await (await conn.execute(
            "SELECT count(*) FROM memory_terms WHERE scope = 'default'")).fetchone()
        out["terms"] = int(row[0]) if row else 0
        clock = await cpu_clock(conn)
        for text_key, label in (("clean", "as written"), ("question", "misspelt")):
            for on in (False, True):
                ms: list[float] = []
                c0 = clock.now()
                for q in questions:
                    await ranked(conn, q[text_key], "default", on, ms)
                client, server = clock.since(c0)
                out[f"{'spelling on' if on else 'spelling off'}, {label}"] = {
                    "p50_ms": round(statistics.median(ms), 2),
                    "p95_ms": round(percentile(ms, 95), 2),
                    "cpu_ms_per_query": round(1000 * (client + server) / len(ms), 2)}
    return out


def report(q: dict[str, Any], speed: dict[str, Any] | None) -> None:
    modes = ("plain BM25", "keel, spelling off", "keel, spelling on")
    rows = []
    for kind, f in q["by_kind"].items():
        rows.append([kind, f["questions"],
                     *(f"{100 * f[m]['turn_hit10']:.1f}" for m in modes),
                     *(f"{f[m]['turn_mrr']:.3f}" for m in modes[1:]),
                     f"{100 * f['restored']:.1f}" if "restored" in f else "",
                     f"{100 * f['one_edit_share']:.0f}" if "one_edit_share" in f else ""])
    print(table(f"{q['questions']} questions, each as written and misspelt ("
                f"{q['real_typo_questions']} with a real typo), k={K}",
                ["asked", "n", "plain hit@10", "keel off", "keel on", "MRR off", "MRR on",
                 "restored %", "one edit %"], rows))
    print("latency ms (p50 / p95), the conversations' scopes: " + "; ".join(
        f"{k} {v['p50']} / {v['p95']}" for k, v in q["latency_ms"].items()))
    if speed:
        print(f"at {speed['documents']:,} documents ({speed['terms']:,} terms): " + "; ".join(
            f"{k} {v['p50_ms']} / {v['p95_ms']} ms, CPU {v['cpu_ms_per_query']} ms"
            for k, v in speed.items() if isinstance(v, dict)), flush=True)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="REALTALK's data/ folder")
    p.add_argument("--heldout", action="store_true", help="LoCoMo, data/locomo/, instead")
    p.add_argument("--size", type=int, default=100_000, help="0: no latency run at size")
    args = p.parse_args()
    folder = args.data / "locomo" if args.heldout else args.data
    convs = (load_locomo if args.heldout else load_conversations)(folder)
    if not convs:
        sys.exit(f"no Chat_*.json in {folder}")
    commit, load, started = source_commit(), _load(), time.perf_counter()
    with temporary_postgres("keel-bench-pg-") as admin:
        q = await quality(fresh_database(admin, "bench_spelling"), convs)
        speed = await latency_at(admin, convs, args.size) if args.size else None
    report(q, speed)
    out = {"benchmark": "spelling",
           "machine": {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                       "cpus": os.cpu_count(), "commit": commit, "load_start": load,
                       "load_end": _load()},
           "dataset": "LoCoMo (data/locomo/)" if args.heldout else "REALTALK (data/)",
           "k": K, "quality": q, "at_size": speed,
           "total_seconds": round(time.perf_counter() - started, 1)}
    path = RESULTS / ("spelling-heldout.json" if args.heldout else "spelling.json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"total {out['total_seconds']} s at commit {commit}; written to {path}")


if __name__ == "__main__":
    asyncio.run(main())
