"""Conversational retrieval: does long memory find the turns that answer a question?

    .venv/bin/python bench/bench_recall.py --data PATH/TO/REALTALK/data [--sizes 10000,100000]
    .venv/bin/python bench/bench_recall.py --data PATH/TO/REALTALK/data --heldout

The data: REALTALK (Lee et al., 2025, "A 21-Day Real-World Dataset for Long-Term
Conversation"): 10 real messaging-app conversations between two people over 21 days
(8,944 messages in 18-25 sessions each) and 728 memory-probing questions, each labelled
with the messages that answer it (`evidence`, dia_ids). Its files carry no licence, so
nothing of it is committed: clone the public GitHub repository danny911kr/REALTALK and pass
its `data/` folder (the Chat_*.json files; its `data/locomo/` copy is not read).

`--heldout` reads only that copy instead: LoCoMo (Maharana et al., 2024; CC BY-NC 4.0, as
its paper states; not committed either), 10 LLM-generated conversations, the held-out set
that checks the fusion tuned on REALTALK, with the same four rankings and no speed runs
(written to recall-heldout.json).

Each conversation is one memory scope; each message is one daily-transcript entry,
indexed the way Keel's vault holds them (`daily_doc` over `transcript_entry`, the speaker's
name as the role, the session as the session id), in bulk with `index_bulk`.
Every question is searched (k=10, no filters) four ways, in one run:
- `plain BM25`: a textbook Okapi BM25 (k1 1.2, b 0.75, lower-cased \\w+ words) over the
  same messages in Python, the reference;
- `keel bm25`: Keel's search without an embedder (BM25 + graph rerank);
- `keel dense`: the dense ranking alone (built-in static model);
- `keel fused`: Keel's hybrid search (reciprocal rank fusion).
Reported per granularity: per turn, a question is a hit@k when one of its evidence messages
is in the top k, MRR from the first one (0 past rank 10); per session, the same with each
hit's session against the evidence messages' sessions. Then speed: bulk indexing
(documents/s, embedding included) and recall latency (p50 / p95 of `recall`, k=5, as a turn
calls it) with the conversations' messages among synthetic filler documents at each size,
how often the recall's 5 hits still hold an answering message among them, and the HNSW
graph's health (`ann_self_recall`).
Last, the project's own search corpus (tests/vault/fixtures/search_corpus, English and
Russian notes and cards with known answers): recall@5 and MRR with and without the embedder,
so hybrid mode is seen not to cost the cases BM25 and the graph already get right.
Written to bench/results/recall.json (recall-custom.json for other options, or `--out NAME`:
a check that should not replace a committed file).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from psycopg import sql

from activities.vault.bulk import index_bulk
from activities.vault.embedder import load_embedder
from activities.vault.search import IndexDoc, recall, search
from activities.vault.store import daily_doc
from bench.bench_memory import filler_docs, fresh_database
from bench.common import ROOT, percentile, source_commit, table
from keel.devstack import temporary_postgres
from schemas.vault.recall import RecallInput
from schemas.vault.rollup import transcript_entry
from schemas.vault.search import recall_at_k, reciprocal_rank
from tests.vault.support import load_corpus, make_ctx

RESULTS = ROOT / "bench" / "results"
K = 10
_WORD = re.compile(r"\w+")


def load_conversations(folder: Path) -> list[dict[str, Any]]:
    """REALTALK: each conversation's messages as index documents and its questions with
    evidence."""
    out = []
    for path in sorted(folder.glob("Chat_*.json")):
        data = json.loads(path.read_text())
        sessions = []
        for key in sorted((k for k in data if re.fullmatch(r"session_\d+", k)),
                          key=lambda k: int(k.split("_")[1])):
            sessions.append((f"s{key.split('_')[1]}", [
                (msg["dia_id"], msg["speaker"], (msg.get("clean_text") or "").strip(),
                 datetime.strptime(msg["date_time"], "%d.%m.%Y, %H:%M:%S").replace(tzinfo=UTC))
                for msg in data[key]]))
        out.append(_conversation(path.stem, sessions,
                                 [(q["question"], q.get("evidence", [])) for q in data["qa"]]))
    return out


def load_locomo(folder: Path) -> list[dict[str, Any]]:
    """LoCoMo (Maharana et al., 2024, the copy in REALTALK's `data/locomo/`), the held-out
    set: 10 LLM-generated multi-session conversations, 5,882 turns. Questions of category 5
    (adversarial: built to have no answer in the conversation) are left out, as are
    evidence ids that name no turn; a turn's time is its session's (plus a second a turn,
    keeping the order)."""
    out = []
    for path in sorted(folder.glob("Chat_*.json")):
        data = json.loads(path.read_text())
        conv = data["conversation"]
        sessions = []
        for key in sorted((k for k in conv if re.fullmatch(r"session_\d+", k)),
                          key=lambda k: int(k.split("_")[1])):
            when = _locomo_time(conv[f"{key}_date_time"])
            sessions.append((f"s{key.split('_')[1]}", [
                (msg["dia_id"], msg["speaker"], (msg.get("text") or "").strip(),
                 when + timedelta(seconds=i)) for i, msg in enumerate(conv[key])]))
        questions = [(q["question"], re.findall(r"D\d+:\d+", " ".join(q.get("evidence", []))))
                     for q in data["qa"] if q.get("category") != 5]
        out.append(_conversation(path.stem, sessions, questions))
    return out


def _locomo_time(text: str) -> datetime:
    """'1:56 pm on 8 May, 2023'."""
    return datetime.strptime(text.replace(",", ""), "%I:%M %p on %d %B %Y").replace(tzinfo=UTC)


def _conversation(name: str, sessions: list[tuple[str, list[tuple[str, str, str, datetime]]]],
                  questions: list[tuple[str, list[str]]]) -> dict[str, Any]:
    """One conversation as a scope's documents (a message: a daily-transcript entry, the
    way the vault holds them) and its questions with the answering documents' paths."""
    docs: dict[str, IndexDoc] = {}
    texts: dict[str, str] = {}
    session_of: dict[str, str] = {}
    n = 0
    for session, messages in sessions:
        for dia_id, speaker_name, text, when in messages:
            if not text:
                continue
            n += 1
            speaker = re.sub(r"\W+", "_", speaker_name.strip()) or "someone"
            entry = transcript_entry(session, n, when, speaker, text)
            doc = daily_doc(f"daily/{when.date().isoformat()}.md", session, n, entry.strip())
            docs[dia_id] = doc
            texts[dia_id] = f"{speaker} {text}"
            session_of[doc.path] = session
    with_evidence = [(q, [docs[e].path for e in ev if e in docs]) for q, ev in questions]
    return {"name": name, "docs": list(docs.values()), "texts": texts,
            "paths": {d: docs[d].path for d in docs}, "session_of": session_of,
            "questions": [(q, ev) for q, ev in with_evidence if ev]}


def plain_bm25(texts: dict[str, str], paths: dict[str, str]) -> Any:
    """A textbook Okapi BM25 over the messages: returns rank(query) -> paths best first."""
    ids = list(texts)
    toks = [_WORD.findall(texts[i].lower()) for i in ids]
    n = len(toks)
    avg = sum(map(len, toks)) / max(n, 1)
    df = collections.Counter(w for t in toks for w in set(t))
    tfs = [collections.Counter(t) for t in toks]

    def rank(query: str) -> list[str]:
        terms = _WORD.findall(query.lower())
        scores = []
        for i, (tf, t) in enumerate(zip(tfs, toks, strict=True)):
            s = 0.0
            for w in terms:
                f = tf.get(w, 0)
                if f:
                    idf = math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
                    s += idf * f * 2.2 / (f + 1.2 * (0.25 + 0.75 * len(t) / avg))
            if s > 0:
                scores.append((-s, i))
        return [paths[ids[i]] for _, i in sorted(scores)[:K]]
    return rank


class Tally:
    def __init__(self) -> None:
        self.values: dict[str, list[float]] = collections.defaultdict(list)
        self.ms: list[float] = []
        self.cpu = [0.0, 0.0]  # seconds: this process, the server

    def add(self, ranked: list[str], evidence: list[str], session_of: dict[str, str]) -> None:
        for gran, got, want in (
                ("turn", ranked, set(evidence)),
                ("session", [session_of.get(p, "") for p in ranked],
                 {session_of[p] for p in evidence})):
            first = next((i for i, x in enumerate(got[:K], start=1) if x in want), None)
            self.values[f"{gran}_hit5"].append(1.0 if first and first <= 5 else 0.0)
            self.values[f"{gran}_hit10"].append(1.0 if first else 0.0)
            self.values[f"{gran}_mrr"].append(1.0 / first if first else 0.0)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: round(statistics.fmean(v), 4) for k, v in self.values.items()}
        if self.ms:
            out["p50_ms"] = round(statistics.median(self.ms), 2)
            out["p95_ms"] = round(percentile(self.ms, 95), 2)
            out["cpu_ms_per_query"] = {
                "client": round(1000 * self.cpu[0] / len(self.ms), 2),
                "server": round(1000 * self.cpu[1] / len(self.ms), 2)}
        return out


async def quality(url: str, convs: list[dict[str, Any]], embedder: Any) -> dict[str, Any]:
    tallies = {m: Tally() for m in ("plain BM25", "keel bm25", "keel dense", "keel fused")}
    indexed = 0
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        clock = await cpu_clock(conn)
        t0, c0 = time.perf_counter(), clock.now()
        for i, conv in enumerate(convs):
            indexed += await index_bulk(conn, conv["docs"], scope=f"rt{i}", embedder=embedder)
        index_s = time.perf_counter() - t0
        index_cpu = clock.since(c0)
        await conn.execute("ANALYZE")
        for i, conv in enumerate(convs):
            rank = plain_bm25(conv["texts"], conv["paths"])
            for question, evidence in conv["questions"]:
                for mode, tally in tallies.items():
                    t1, c1 = time.perf_counter(), clock.now()
                    if mode == "plain BM25":
                        ranked = rank(question)
                    else:
                        hits = await search(conn, question, scope=f"rt{i}", k=K,
                                            embedder=None if mode == "keel bm25" else embedder,
                                            use_lexical=mode != "keel dense")
                        ranked = [h.path for h in hits]
                    tally.ms.append((time.perf_counter() - t1) * 1000)
                    used = clock.since(c1)
                    tally.cpu[0] += used[0]
                    tally.cpu[1] += used[1]
                    tally.add(ranked, evidence, conv["session_of"])
    return {"documents": indexed, "scopes": len(convs),
            "questions": sum(len(c["questions"]) for c in convs),
            "index_cpu_s": {"client": round(index_cpu[0], 1), "server": round(index_cpu[1], 1)},
            "index_s": round(index_s, 2), "docs_per_s": round(indexed / index_s),
            "docs_per_cpu_s": round(indexed / sum(index_cpu)),
            "modes": {m: t.summary() for m, t in tallies.items()}}


def _proc_stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


class CpuClock:
    """CPU seconds spent by this process and by the server (the embedded PostgreSQL runs
    here): the connection's backend, plus whatever its server's finished processes spent
    (parallel index-build workers, autovacuum): a figure that other work on the machine
    does not inflate the way it inflates wall time."""

    def __init__(self, backend_pid: int) -> None:
        self.pid = backend_pid
        try:
            self.postmaster: int | None = int(_proc_stat(backend_pid)[1])
        except (OSError, ValueError):
            self.postmaster = None

    def server(self) -> float:
        try:
            own = _proc_stat(self.pid)
            reaped = _proc_stat(self.postmaster) if self.postmaster else None
        except OSError:
            return float("nan")
        ticks = int(own[11]) + int(own[12])
        if reaped:  # children's time the postmaster has collected
            ticks += int(reaped[13]) + int(reaped[14])
        return ticks / os.sysconf("SC_CLK_TCK")

    def now(self) -> tuple[float, float]:
        return time.process_time(), self.server()

    def since(self, start: tuple[float, float]) -> tuple[float, float]:
        client, server = self.now()
        return client - start[0], server - start[1]


def _load() -> list[float]:
    """The machine's load averages (1, 5, 15 min): how much others were running."""
    return [round(x, 2) for x in os.getloadavg()]


async def cpu_clock(conn: Any) -> CpuClock:
    row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
    return CpuClock(int(row[0]))


async def speed(admin: str, convs: list[dict[str, Any]], embedder: Any, size: int,
                repeat: int) -> dict[str, Any]:
    """Recall latency in one scope of `size` documents (the messages plus filler)."""
    url = fresh_database(admin, f"bench_recall_{size}")
    own = [d for c in convs for d in c["docs"]]
    docs = own + filler_docs(max(0, size - len(own)), seed=11)
    questions = [(q, set(ev)) for c in convs for q, ev in c["questions"]]
    out: dict[str, Any] = {"documents": len(docs), "load_start": _load()}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        clock = await cpu_clock(conn)
        t0, c0 = time.perf_counter(), clock.now()
        await index_bulk(conn, docs, scope="default", embedder=embedder)
        wall = time.perf_counter() - t0
        client, server = clock.since(c0)
        out.update(index_s=round(wall, 1), docs_per_s=round(len(docs) / wall),
                   index_cpu_s={"client": round(client, 1), "server": round(server, 1)},
                   docs_per_cpu_s=round(len(docs) / (client + server)))
        await conn.execute("VACUUM ANALYZE")
        out["ann_self_recall"] = await ann_self_recall(conn, embedder)
        for label, emb in (("bm25", None), ("fused", embedder)):
            times = []
            found = 0
            c0 = clock.now()
            for _ in range(repeat):
                for q, evidence in questions:
                    t1 = time.perf_counter()
                    got = await recall(conn, RecallInput(session_id="bench", query=q),
                                       scope="default", embedder=emb)
                    times.append((time.perf_counter() - t1) * 1000)
                    found += bool(evidence & set(got.sources))
            client, server = clock.since(c0)
            out[label] = {"turn_hit5": round(found / len(times), 4),
                          "p50_ms": round(statistics.median(times), 2),
                          "p95_ms": round(percentile(times, 95), 2), "queries": len(times),
                          "cpu_ms_per_query": {"client": round(1000 * client / len(times), 2),
                                               "server": round(1000 * server / len(times), 2)}}
    out["load_end"] = _load()
    return out


async def ann_self_recall(conn: Any, embedder: Any, sample: int = 200) -> float:
    """The HNSW graph's health: the share of `sample` message chunks (of the conversations,
    among the filler) that the index finds in the top 10 by their own vector, as a search
    walks it (ef_search 100, iterative scans). A chunk the walk cannot reach is lost to
    dense search: a graph built over a tight cluster (the filler) can strand the rest, and
    the fused hit@5 of such a run falls to BM25's."""
    from activities.vault.dense import EF_SEARCH

    await conn.execute(f"SET hnsw.ef_search = {EF_SEARCH}")
    await conn.execute("SET hnsw.iterative_scan = relaxed_order")
    # The model and dimensions as literals: the planner must see them to use the index.
    cur = await conn.execute(sql.SQL(
        """WITH q AS (SELECT path, chunk, embedding FROM memory_chunks
                      WHERE path LIKE 'daily/%%' ORDER BY path, chunk LIMIT %s)
           SELECT count(*) FILTER (WHERE (q.path, q.chunk) IN (
               SELECT c.path, c.chunk FROM memory_chunks c WHERE c.model = {model}
               ORDER BY c.embedding::halfvec({dims}) <=> q.embedding::halfvec({dims})
               LIMIT 10)), count(*) FROM q""").format(
        model=sql.Literal(embedder.name), dims=sql.Literal(embedder.dims)), (sample,))
    found, total = await cur.fetchone()
    return round(found / max(total, 1), 3)


async def corpus(admin: str, embedder: Any) -> dict[str, Any]:
    """The built-in search corpus, BM25 + graph against hybrid."""
    from activities.db import close_pools
    from activities.vault.dense import embed_pending

    url = fresh_database(admin, "bench_recall_corpus")
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-"))
    try:
        ctx = make_ctx(tmp, url)
        ctx.vault.ensure()
        queries = await load_corpus(ctx)
        out: dict[str, Any] = {"queries": len(queries)}
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await embed_pending(conn, embedder, scope="default")
            for label, emb in (("bm25", None), ("fused", embedder)):
                r5 = mrr = 0.0
                for q in queries:
                    paths = [h.path for h in await search(conn, q["query"], scope="default",
                                                          k=10, embedder=emb)]
                    r5 += recall_at_k(paths, set(q["relevant"]))
                    mrr += reciprocal_rank(paths, set(q["relevant"]))
                out[label] = {"recall_at_5": round(r5 / len(queries), 3),
                              "mrr": round(mrr / len(queries), 3)}
        return out
    finally:
        await close_pools()
        shutil.rmtree(tmp, ignore_errors=True)


def print_quality(q: dict[str, Any], dataset: str) -> None:
    rows = []
    for mode, f in q["modes"].items():
        rows.append([mode, *(f"{100 * f[k]:.1f}" for k in ("turn_hit5", "turn_hit10")),
                     f"{f['turn_mrr']:.3f}",
                     *(f"{100 * f[k]:.1f}" for k in ("session_hit5", "session_hit10")),
                     f"{f['session_mrr']:.3f}", f"{f['p50_ms']} / {f['p95_ms']}",
                     "{client} + {server}".format(**f["cpu_ms_per_query"])])
    print(table(f"{dataset}: {q['questions']} questions over {q['documents']:,} messages "
                f"({q['scopes']} scopes), k={K}",
                ["ranking", "turn hit@5", "hit@10", "MRR", "session hit@5", "hit@10", "MRR",
                 "p50 / p95 ms", "CPU ms"], rows))
    print(f"bulk indexing with embedding: {q['docs_per_s']:,} documents/s "
          f"({q['docs_per_cpu_s']:,} per CPU-second)", flush=True)


def print_speed(speeds: list[dict[str, Any]]) -> None:
    def cpu(f: dict[str, Any]) -> str:
        c = f["cpu_ms_per_query"]
        return f"{c['client']} + {c['server']}"

    print(table("Recall (k=5) in one scope (CPU: this process + its PostgreSQL backend)",
                ["documents", "indexing docs/s", "per CPU-s", "bm25 hit@5", "p50 / p95",
                 "CPU ms", "fused hit@5", "p50 / p95", "CPU ms", "graph"],
                [[f"{s['documents']:,}", f"{s['docs_per_s']:,}", f"{s['docs_per_cpu_s']:,}",
                  f"{100 * s['bm25']['turn_hit5']:.1f}",
                  f"{s['bm25']['p50_ms']} / {s['bm25']['p95_ms']}", cpu(s["bm25"]),
                  f"{100 * s['fused']['turn_hit5']:.1f}",
                  f"{s['fused']['p50_ms']} / {s['fused']['p95_ms']}", cpu(s["fused"]),
                  f"{s.get('ann_self_recall', float('nan')):.2f}"]
                 for s in speeds]), flush=True)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True, help="REALTALK's data/ folder")
    p.add_argument("--heldout", action="store_true",
                   help="the held-out set instead: LoCoMo, data/locomo/ (retrieval only, "
                        "the fusion as tuned on REALTALK; no speed runs unless --sizes)")
    p.add_argument("--sizes", default=None, help="default 10000,100000 (none with --heldout)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--embedder", default="minilm-l6-static-256")
    p.add_argument("--out", default=None,
                   help="results file name in bench/results (default: recall.json, "
                        "recall-heldout.json, or recall-custom.json for other options)")
    args = p.parse_args()
    sizes = args.sizes if args.sizes is not None else "" if args.heldout else "10000,100000"
    folder = args.data / "locomo" if args.heldout else args.data
    convs = (load_locomo if args.heldout else load_conversations)(folder)
    if not convs:
        sys.exit(f"no Chat_*.json in {folder}")
    dataset = ("LoCoMo (danny911kr/REALTALK, data/locomo/Chat_*.json, categories 1-4)"
               if args.heldout else "REALTALK (danny911kr/REALTALK, data/Chat_*.json)")
    embedder = load_embedder(args.embedder)
    commit = source_commit()
    started = time.perf_counter()
    with temporary_postgres("keel-bench-pg-") as admin:
        load = _load()
        q = await quality(fresh_database(admin, "bench_recall_quality"), convs, embedder)
        print_quality(q, dataset.split(" (")[0])
        speeds = []
        for n in (int(s) for s in sizes.split(",") if s):
            speeds.append(await speed(admin, convs, embedder, n, args.repeat))
            print_speed(speeds[-1:])
        corpus_figures = await corpus(admin, embedder)
    print(f"search corpus ({corpus_figures['queries']} queries): BM25 + graph recall@5 "
          f"{corpus_figures['bm25']['recall_at_5']} MRR {corpus_figures['bm25']['mrr']}; "
          f"fused recall@5 {corpus_figures['fused']['recall_at_5']} MRR "
          f"{corpus_figures['fused']['mrr']}")
    out = {"benchmark": "recall",
           "machine": {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                       "cpus": os.cpu_count(), "python": platform.python_version(),
                       "commit": commit,
                       # Others' work on the machine: load averages at the start and end.
                       "load_start": load, "load_end": _load()},
           "dataset": dataset,
           "embedder": getattr(embedder, "name", None), "k": K, "quality": q,
           "speed": speeds, "corpus": corpus_figures,
           "total_seconds": round(time.perf_counter() - started, 1)}
    default = (args.sizes, args.repeat, args.embedder) == (None, 1, "minilm-l6-static-256")
    path = RESULTS / (f"{args.out}.json" if args.out
                      else "recall-custom.json" if not default
                      else "recall-heldout.json" if args.heldout else "recall.json")
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"total {out['total_seconds']} s at commit {commit}; written to "
          f"{path.relative_to(ROOT)}")


if __name__ == "__main__":
    asyncio.run(main())
