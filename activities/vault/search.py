"""memory_search: Okapi BM25 in PostgreSQL's own full-text index, then the graph rerank.

Candidates come from the GIN index (`simple` configuration, so any language indexes alike),
BM25 scores them with the document-frequency table the triggers keep current, and the
ranking rules of `schemas.vault.search` finish the order. Hybrid mode fuses a dense ranking
from a pluggable embedder by reciprocal rank fusion; it is off by default, and nothing here
downloads a model.

Scopes: every function takes the memory scope it works in, as a required keyword, and
every statement filters by it (documents, term statistics, corpus size, links,
embeddings): nothing of one scope is read, ranked by or written into another.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import re
import struct
from collections.abc import Sequence
from typing import Any, Protocol

from psycopg import AsyncConnection
from pydantic import BaseModel, Field

from schemas.vault.recall import (
    SNIPPET_MAX_CHARS,
    MemoryHit,
    RecallInput,
    RecallResult,
    fence_memory,
)
from schemas.vault.recall_rules import (
    MAX_RECALL_K,
    RECALL_KINDS,
    distinct_snippets,
    wants_recall,
)
from schemas.vault.search import (
    BM25_B,
    BM25_K1,
    CANDIDATE_POOL,
    COLUMN_WEIGHTS,
    GRAPH_SEEDS,
    Candidate,
    base_score,
    cosine,
    rerank,
    rrf_fuse,
    term_patterns,
)

MAX_QUERY_TERMS = 32
# A term in more than this share of all documents does not choose candidates (it still
# scores them).
COMMON_TERM_SHARE = 0.05
# A tsvector holds at most 1 MB; bodies past this are indexed by their beginning only.
MAX_INDEXED_CHARS = 100_000


class IndexDoc(BaseModel):
    path: str
    kind: str
    title: str = ""
    tags: str = ""
    body: str
    card_key: str | None = None
    card_type: str | None = None
    status: str | None = None
    penalised: bool = False
    session_id: str | None = None
    seq: int | None = None
    links: list[str] = Field(default_factory=list)  # link keys this document points to

    def content_hash(self) -> str:
        h = hashlib.sha256()
        for part in (self.kind, self.title, self.tags, self.body, self.card_key or "",
                     self.card_type or "", self.status or "", str(self.penalised),
                     "\x1f".join(self.links)):
            h.update(part.encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
        return h.hexdigest()


_UPSERT = """
INSERT INTO memory_docs (scope, path, kind, title, tags, body, card_key, card_type, status,
                         penalised, session_id, seq, content_hash, tsv, doc_len)
SELECT %(scope)s, %(path)s, %(kind)s, %(title)s, %(tags)s, %(body)s, %(card_key)s, %(card_type)s,
       %(status)s, %(penalised)s, %(session_id)s, %(seq)s, %(hash)s, v.tsv,
       (SELECT coalesce(sum(cardinality(u.positions)), 0) FROM unnest(v.tsv) u)
FROM (SELECT setweight(to_tsvector('simple', %(title)s), 'A')
          || setweight(to_tsvector('simple', %(tags)s), 'B')
          || setweight(to_tsvector('simple', left(%(body)s, %(max_chars)s)), 'D') AS tsv) v
ON CONFLICT (scope, path) DO UPDATE SET
    kind = EXCLUDED.kind, title = EXCLUDED.title, tags = EXCLUDED.tags, body = EXCLUDED.body,
    card_key = EXCLUDED.card_key, card_type = EXCLUDED.card_type, status = EXCLUDED.status,
    penalised = EXCLUDED.penalised, session_id = EXCLUDED.session_id, seq = EXCLUDED.seq,
    content_hash = EXCLUDED.content_hash, tsv = EXCLUDED.tsv, doc_len = EXCLUDED.doc_len,
    indexed_at = now()
WHERE memory_docs.content_hash <> EXCLUDED.content_hash
RETURNING path
"""


def _clean(text: str) -> str:
    # PostgreSQL text cannot hold NUL; lone surrogates (from undecodable bytes) cannot be
    # sent either.
    return text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


async def index_document(conn: AsyncConnection, doc: IndexDoc, *, scope: str) -> bool:
    """Index one document; True when it was new or changed (same hash: nothing is done)."""
    params: dict[str, Any] = doc.model_dump(exclude={"links"})
    for key in ("title", "tags", "body"):
        params[key] = _clean(params[key])
    params["hash"] = doc.content_hash()
    params["max_chars"] = MAX_INDEXED_CHARS
    params["scope"] = scope
    async with conn.transaction():
        cur = await conn.execute(_UPSERT, params)
        changed = await cur.fetchone() is not None
        if changed:
            src = doc.card_key or doc.path
            await conn.execute("DELETE FROM memory_links WHERE scope = %s AND src = %s",
                               (scope, src))
            if doc.links:
                await conn.execute(
                    "INSERT INTO memory_links (scope, src, dst)"
                    " SELECT %s, %s, d FROM unnest(%s::text[]) d"
                    " WHERE d <> %s ON CONFLICT DO NOTHING",
                    (scope, src, sorted(set(doc.links)), src))
    return changed


async def delete_documents(conn: AsyncConnection, paths: Sequence[str], *, scope: str) -> int:
    if not paths:
        return 0
    async with conn.transaction():
        cur = await conn.execute(
            "DELETE FROM memory_docs WHERE scope = %s AND path = ANY(%s)"
            " RETURNING card_key, path", (scope, list(paths)))
        gone = await cur.fetchall()
        srcs = [key or path for key, path in gone]
        if srcs:
            await conn.execute("DELETE FROM memory_links WHERE scope = %s AND src = ANY(%s)",
                               (scope, srcs))
    return len(gone)


async def rebuild_statistics(conn: AsyncConnection, *, scope: str) -> None:
    """Recount document frequencies and corpus size from the documents themselves.

    The triggers keep them exact on every write; this is for bulk loads that bypass the
    triggers (and for repairing a database restored from parts).
    """
    async with conn.transaction():
        await conn.execute("DELETE FROM memory_terms WHERE scope = %s", (scope,))
        await conn.execute(
            "INSERT INTO memory_terms (scope, term, df) SELECT %s, u.lexeme, count(*)"
            " FROM memory_docs d, unnest(d.tsv) u WHERE d.scope = %s GROUP BY u.lexeme",
            (scope, scope))
        await conn.execute(
            "INSERT INTO memory_stats AS m (scope, n_docs, total_len)"
            " SELECT %s, count(*), coalesce(sum(doc_len), 0) FROM memory_docs WHERE scope = %s"
            " ON CONFLICT (scope) DO UPDATE SET n_docs = EXCLUDED.n_docs,"
            " total_len = EXCLUDED.total_len", (scope, scope))


async def indexed_hashes(conn: AsyncConnection, prefix: str = "", *, scope: str
                         ) -> dict[str, str]:
    cur = await conn.execute(
        "SELECT path, content_hash FROM memory_docs WHERE scope = %s AND path LIKE %s",
        (scope, prefix.replace("%", "\\%").replace("_", "\\_") + "%"))
    return {p: h for p, h in await cur.fetchall()}


# --- BM25 ---------------------------------------------------------------------------------

_WEIGHT_SQL = " ".join(f"WHEN '{w}' THEN {v}" for w, v in COLUMN_WEIGHTS.items())

_BM25 = f"""
WITH qt AS (
    SELECT t.i, t.pattern, t.tsq
    FROM unnest(%(patterns)s::text[], %(tsqs)s::text[]) WITH ORDINALITY AS t(pattern, tsq, i)
),
stats AS (
    SELECT greatest(n_docs, 1)::float8 AS n,
           greatest(total_len::float8 / greatest(n_docs, 1), 1) AS avgdl
    FROM (SELECT coalesce((SELECT n_docs FROM memory_stats WHERE scope = %(scope)s), 0)
                 AS n_docs,
                 coalesce((SELECT total_len FROM memory_stats WHERE scope = %(scope)s), 0)
                 AS total_len) ms
),
qidf AS (
    SELECT qt.i, qt.tsq, d.df, ln(1 + (s.n - d.df + 0.5) / (d.df + 0.5)) AS idf
    FROM qt, stats s,
         LATERAL (SELECT least(coalesce(sum(m.df), 0), s.n) AS df
                  FROM memory_terms m
                  WHERE m.scope = %(scope)s AND m.term LIKE qt.pattern) d
),
-- Candidates come from the informative terms: a word in most documents would fill the
-- pool with documents that only share it (ts_rank knows no IDF). Common words still
-- count in the score below.
informative AS (
    SELECT q.* FROM qidf q, stats s
    WHERE q.df <= greatest(%(pool)s, s.n * {COMMON_TERM_SHARE})
       OR NOT EXISTS (SELECT 1 FROM qidf q2
                      WHERE q2.df <= greatest(%(pool)s, s.n * {COMMON_TERM_SHARE}))
),
cand AS (
    SELECT DISTINCT c.path, c.tsv, c.doc_len
    FROM informative q
    CROSS JOIN LATERAL (
        SELECT d.path, d.tsv, d.doc_len
        FROM memory_docs d
        WHERE d.scope = %(scope)s AND d.tsv @@ to_tsquery('simple', q.tsq)
          AND (%(kinds)s::text[] IS NULL OR d.kind = ANY(%(kinds)s::text[]))
          AND (%(exclude_session)s::text IS NULL
               OR d.session_id IS DISTINCT FROM %(exclude_session)s::text)
        ORDER BY ts_rank(d.tsv, to_tsquery('simple', q.tsq)) DESC, d.path
        LIMIT %(pool)s
    ) c
),
tf AS (
    SELECT c.path, qt.i,
           sum((SELECT sum(CASE w {_WEIGHT_SQL} ELSE 1.0 END)
                FROM unnest(u.weights) w)) AS tf
    FROM cand c
    CROSS JOIN LATERAL unnest(c.tsv) u
    JOIN qt ON u.lexeme LIKE qt.pattern
    GROUP BY c.path, qt.i
),
scored AS (
    SELECT tf.path,
           sum(q.idf * tf.tf * ({BM25_K1} + 1)
               / (tf.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * c.doc_len / s.avgdl))) AS bm25,
           sum(q.idf) AS matched_idf
    FROM tf JOIN qidf q USING (i) JOIN cand c USING (path) CROSS JOIN stats s
    GROUP BY tf.path
)
SELECT d.path, d.card_key, d.penalised, sc.bm25,
       sc.matched_idf / nullif((SELECT sum(idf) FROM qidf), 0) AS coverage,
       (SELECT count(*) FROM memory_links l
        WHERE l.scope = %(scope)s AND l.dst = d.card_key) AS incoming
FROM scored sc JOIN memory_docs d ON d.scope = %(scope)s AND d.path = sc.path
ORDER BY sc.bm25 DESC, d.path
"""


async def query_lexemes(conn: AsyncConnection, query: str) -> list[str]:
    cur = await conn.execute(
        "SELECT lexeme FROM unnest(to_tsvector('simple', %s)) ORDER BY lexeme", (_clean(query),))
    return [r[0] for r in await cur.fetchall()][:MAX_QUERY_TERMS]


async def bm25_candidates(conn: AsyncConnection, query: str, *, scope: str,
                          kinds: list[str] | None = None,
                          exclude_session: str | None = None, pool: int = CANDIDATE_POOL,
                          ) -> list[Candidate]:
    terms = term_patterns(await query_lexemes(conn, query))
    if not terms:
        return []
    cur = await conn.execute(_BM25, {
        "patterns": [p for _, p, _ in terms],
        "tsqs": [q for _, _, q in terms],
        "kinds": kinds, "exclude_session": exclude_session, "pool": pool, "scope": scope,
    })
    return [Candidate(path=path, card_key=key, penalised=pen, bm25=float(bm25),
                      coverage=float(cov or 0.0), incoming=int(inc))
            for path, key, pen, bm25, cov, inc in await cur.fetchall()]


async def _graph_around(conn: AsyncConnection, seeds: list[str], scope: str
                        ) -> list[tuple[str, str]]:
    """Every link edge within two hops of the seed cards."""
    edges: set[tuple[str, str]] = set()
    frontier = set(seeds)
    seen = set(seeds)
    for _ in range(2):
        if not frontier:
            break
        cur = await conn.execute(
            "SELECT src, dst FROM memory_links WHERE scope = %(s)s"
            " AND (src = ANY(%(k)s) OR dst = ANY(%(k)s))", {"k": sorted(frontier), "s": scope})
        rows = await cur.fetchall()
        edges.update((s, d) for s, d in rows)
        nxt = {x for s, d in rows for x in (s, d)} - seen
        seen |= nxt
        frontier = nxt
    return sorted(edges)


async def _neighbour_docs(conn: AsyncConnection, keys: list[str], exclude: set[str],
                          scope: str) -> list[Candidate]:
    if not keys:
        return []
    cur = await conn.execute(
        "SELECT d.path, d.card_key, d.penalised,"
        " (SELECT count(*) FROM memory_links l WHERE l.scope = d.scope"
        " AND l.dst = d.card_key) FROM memory_docs d"
        " WHERE d.scope = %s AND d.card_key = ANY(%s) AND d.kind = 'card'", (scope, keys))
    return [Candidate(path=p, card_key=k, penalised=pen, bm25=0.0, coverage=0.0, incoming=inc)
            for p, k, pen, inc in await cur.fetchall() if p not in exclude]


async def _hits(conn: AsyncConnection, query: str, ranked: list[tuple[str, float, bool]],
                scope: str) -> list[MemoryHit]:
    if not ranked:
        return []
    terms = term_patterns(await query_lexemes(conn, query))
    tsq = " | ".join(q for _, _, q in terms) or "''"
    cur = await conn.execute(
        "SELECT path, kind, title, CASE WHEN kind = 'card' OR length(body) <= %(max)s"
        " THEN left(body, %(max)s) ELSE ts_headline('simple', left(body, 50000),"
        " to_tsquery('simple', %(tsq)s), 'StartSel=\"\", StopSel=\"\", MaxWords=60,"
        " MinWords=20, MaxFragments=3, FragmentDelimiter=\" … \"') END"
        " FROM memory_docs WHERE scope = %(scope)s AND path = ANY(%(paths)s)",
        {"paths": [p for p, _, _ in ranked], "tsq": tsq, "max": SNIPPET_MAX_CHARS,
         "scope": scope})
    info = {r[0]: r for r in await cur.fetchall()}
    out = []
    for path, score, via in ranked:
        if path in info:
            _, kind, title, snippet = info[path]
            out.append(MemoryHit(path=path, kind=kind, title=title, snippet=snippet or "",
                                 score=round(score, 4), via_link=via))
    return out


async def search(conn: AsyncConnection, query: str, *, scope: str, k: int = 5,
                 kinds: list[str] | None = None, exclude_session: str | None = None,
                 use_graph: bool = True, embedder: Embedder | None = None) -> list[MemoryHit]:
    """The k best documents for `query`: BM25, graph rerank, and (with an embedder) RRF."""
    candidates = await bm25_candidates(conn, query, scope=scope, kinds=kinds,
                                       exclude_session=exclude_session)
    edges: list[tuple[str, str]] = []
    neighbours: list[Candidate] = []
    if use_graph and candidates:
        ordered = sorted(candidates, key=lambda c: (-base_score(c), c.path))
        seeds = [c.card_key for c in ordered if c.card_key][:GRAPH_SEEDS]
        if seeds:
            edges = await _graph_around(conn, seeds, scope)
            reached = sorted({x for e in edges for x in e} - set(seeds))
            neighbours = await _neighbour_docs(conn, reached, {c.path for c in candidates},
                                               scope)
    ranked = rerank(candidates, edges, neighbours, use_graph=use_graph)
    if embedder is None:
        top = [(r.path, r.score, r.via_link) for r in ranked[:k]]
        return await _hits(conn, query, top, scope)
    dense = await dense_ranking(conn, embedder, query, scope=scope, kinds=kinds,
                                exclude_session=exclude_session, limit=max(50, k * 10))
    scores = {r.path: (r.score, r.via_link) for r in ranked}
    fused = rrf_fuse([[r.path for r in ranked[:CANDIDATE_POOL]], dense])[:k]
    return await _hits(conn, query, [(p, scores.get(p, (0.0, False))[0],
                                      scores.get(p, (0.0, False))[1]) for p in fused],
                       scope)


async def recall(conn: AsyncConnection, inp: RecallInput, *, scope: str,
                 embedder: Embedder | None = None) -> RecallResult:
    """The `<memory-context>` block for a turn's query ("" when nothing matches): a read of
    the index only, in `scope` (already checked). The session's own messages are left out
    (its window and checkpoint carry them); an input without content words recalls nothing;
    a snippet is shown once. The hits' access count is the caller's to touch."""
    if not wants_recall(inp.query):
        return RecallResult(block="", hits=0)
    k = max(1, min(inp.k, MAX_RECALL_K))
    hits = await search(conn, inp.query, scope=scope, k=2 * k, kinds=RECALL_KINDS,
                        exclude_session=inp.session_id, embedder=embedder)
    hits = distinct_snippets(hits, k)
    return RecallResult(block=fence_memory(hits), hits=len(hits),
                        sources=[h.path for h in hits])


async def touch_documents(conn: AsyncConnection, paths: list[str], *, scope: str) -> None:
    """Count a recall: decay keeps recalled cards relevant."""
    if paths:
        await conn.execute(
            "UPDATE memory_docs SET access_count = access_count + 1, last_access = now()"
            " WHERE scope = %s AND path = ANY(%s)", (scope, paths))


# --- hybrid: a pluggable embedder ----------------------------------------------------------


class Embedder(Protocol):
    """What hybrid mode needs from an embedding model."""

    name: str

    def embed(self, texts: list[str]) -> list[list[float]]: ...


_WORD = re.compile(r"\w+", re.UNICODE)


class HashingEmbedder:
    """A dependency-free embedder: hashed words and character trigrams, L2-normalised.

    It is a baseline that makes hybrid mode run anywhere (and in tests), not a semantic
    model: it catches spelling variants and word forms that exact BM25 terms miss.
    """

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim
        self.name = f"hashing-{dim}"

    def _bucket(self, feature: str) -> tuple[int, float]:
        digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
        value = struct.unpack("<Q", digest)[0]
        return value % self.dim, (1.0 if (value >> 63) else -1.0)

    def embed(self, texts: list[str]) -> list[list[float]]:
        out = []
        for text in texts:
            vec = [0.0] * self.dim
            for word in _WORD.findall(text.casefold()):
                features = [f"w:{word}"]
                padded = f"#{word}#"
                features += [f"t:{padded[i:i + 3]}" for i in range(len(padded) - 2)]
                for feature in features:
                    idx, sign = self._bucket(feature)
                    vec[idx] += sign
            norm = math.sqrt(sum(v * v for v in vec)) or 1.0
            out.append([v / norm for v in vec])
        return out


def load_embedder(spec: str | None) -> Embedder | None:
    """`None`: BM25 only. `"hashing"`: the built-in baseline. `"module:factory"`: a factory
    returning an Embedder (for example one wrapping sentence-transformers)."""
    if not spec:
        return None
    if spec == "hashing":
        return HashingEmbedder()
    module_name, _, attr = spec.partition(":")
    factory = getattr(importlib.import_module(module_name), attr or "embedder")
    embedder: Embedder = factory()
    return embedder


async def embed_pending(conn: AsyncConnection, embedder: Embedder, batch: int = 64,
                        limit: int | None = None, *, scope: str) -> int:
    """Embed documents whose vector is missing or stale (at most `limit`); returns how many."""
    done = 0
    while limit is None or done < limit:
        cur = await conn.execute(
            "SELECT d.path, d.content_hash, d.title || E'\\n' || left(d.body, 4000)"
            " FROM memory_docs d LEFT JOIN memory_embeddings e"
            " ON e.scope = d.scope AND e.path = d.path AND e.model = %s"
            " WHERE d.scope = %s AND (e.path IS NULL OR e.content_hash <> d.content_hash)"
            " LIMIT %s", (embedder.name, scope, batch))
        rows = await cur.fetchall()
        if not rows:
            break
        vectors = embedder.embed([r[2] for r in rows])
        async with conn.transaction():
            for (path, digest, _), vec in zip(rows, vectors, strict=True):
                await conn.execute(
                    "INSERT INTO memory_embeddings (scope, path, model, content_hash, vector)"
                    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (scope, path) DO UPDATE SET"
                    " model = EXCLUDED.model, content_hash = EXCLUDED.content_hash,"
                    " vector = EXCLUDED.vector", (scope, path, embedder.name, digest, vec))
        done += len(rows)
    return done


async def dense_ranking(conn: AsyncConnection, embedder: Embedder, query: str, *, scope: str,
                        kinds: list[str] | None = None, exclude_session: str | None = None,
                        limit: int = 50) -> list[str]:
    """Paths by cosine similarity to the query. Brute force over plain arrays: fine for a
    personal vault; pgvector would be the step for millions of documents."""
    qvec = embedder.embed([query])[0]
    cur = await conn.execute(
        "SELECT e.path, e.vector FROM memory_embeddings e JOIN memory_docs d"
        " ON d.scope = e.scope AND d.path = e.path"
        " WHERE e.scope = %s AND e.model = %s AND (%s::text[] IS NULL OR d.kind = ANY(%s::text[]))"
        " AND (%s::text IS NULL OR d.session_id IS DISTINCT FROM %s::text)",
        (scope, embedder.name, kinds, kinds, exclude_session, exclude_session))
    scored = [(cosine(qvec, list(vec)), path) for path, vec in await cur.fetchall()]
    scored.sort(key=lambda t: (-t[0], t[1]))
    return [p for s, p in scored[:limit] if s > 0]
