"""memory_search: Okapi BM25 in PostgreSQL's own full-text index, the graph rerank, and
the dense ranking fused with it by reciprocal rank (hybrid mode).

BM25 (activities.vault.bm25: candidates from the GIN index, the `simple` parser's words so
any language indexes alike, English words with their stems too) ranks first, and the
ranking rules of `schemas.vault.search` finish the order. With an embedder (the built-in
static model by default when installed, activities.vault.embedder) the dense ranking of the
documents' chunks (activities.vault.dense) is fused in; every hit names its document, its
chunk and the place in the document it shows, and carries its score components. Nothing
here downloads a model.

Cost: the candidate pool follows the hits asked for (`candidate_pool(k)`), not the scope's
size, and snippets are cut from the returned documents only, in Python. A search is three
round trips (the query's words beside the dense search, one pipeline; BM25; the returned
hits' text), four when cards among BM25's best bring the graph walk (one more pipeline),
and the spelling's one to three (activities.vault.spelling) when a query word could be
misspelt; the turn's recall corrects nothing.

Scopes: every function takes the memory scope it works in, as a required keyword, and
every statement filters by it (documents, term statistics, corpus size, links, chunks):
nothing of one scope is read, ranked by or written into another.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from pydantic import BaseModel, Field

from activities.vault.bm25 import (
    LEXEMES,
    bm25,
    clean_text,
    lexeme_params,
    words_of,
)
from activities.vault.dense import (
    ChunkSource,
    dense_results,
    embed_pending,
    embed_texts,
    plan_dense,
    start_chunks,
    store_chunks,
)
from activities.vault.embedder import Embedder, HashingEmbedder, load_embedder
from activities.vault.spelling import corrections
from schemas.vault.language import SAMPLE_CHARS, stem_language
from schemas.vault.recall import (
    SNIPPET_MAX_CHARS,
    MemoryHit,
    RecallInput,
    RecallResult,
    SearchHits,
)
from schemas.vault.recall import (
    fence_memory as fence_memory,
)
from schemas.vault.recall_rules import (
    MAX_RECALL_K,
    RECALL_KINDS,
    distinct_snippets,
    wants_recall,
)
from schemas.vault.rollup import without_markers
from schemas.vault.search import (
    DENSE_FLOOR,
    GRAPH_SEEDS,
    Candidate,
    DenseHit,
    Fused,
    Ranked,
    base_score,
    candidate_pool,
    dense_pool,
    fuse,
    rerank,
    snippet_span,
)
from schemas.vault.terms import TERMS_VERSION, extra_terms

__all__ = ["Embedder", "HashingEmbedder", "IndexDoc", "MemoryDoc", "embed_pending",
           "index_document", "index_documents", "load_embedder", "read_document", "recall",
           "search"]

# A tsvector holds at most 1 MB; bodies past this are indexed by their beginning only.
MAX_INDEXED_CHARS = 100_000
# How much of a returned document the snippet is cut from.
SNIPPET_SOURCE_CHARS = 200_000


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
        # Each part NUL-terminated, hashed in one update (the same digest as part by part).
        parts = (self.kind, self.title, self.tags, self.body, self.card_key or "",
                 self.card_type or "", self.status or "", str(self.penalised),
                 "\x1f".join(self.links), "")
        return hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


# A document already indexed is rewritten only when its content changed.
_ON_CONFLICT = """
ON CONFLICT (scope, path) DO UPDATE SET
    kind = EXCLUDED.kind, title = EXCLUDED.title, tags = EXCLUDED.tags, body = EXCLUDED.body,
    card_key = EXCLUDED.card_key, card_type = EXCLUDED.card_type, status = EXCLUDED.status,
    penalised = EXCLUDED.penalised, session_id = EXCLUDED.session_id, seq = EXCLUDED.seq,
    content_hash = EXCLUDED.content_hash, tsv = EXCLUDED.tsv, doc_len = EXCLUDED.doc_len,
    terms_version = EXCLUDED.terms_version, stem_language = EXCLUDED.stem_language,
    indexed_at = now()
WHERE memory_docs.content_hash <> EXCLUDED.content_hash
"""

_UPSERT = """
INSERT INTO memory_docs (scope, path, kind, title, tags, body, card_key, card_type, status,
                         penalised, session_id, seq, content_hash, tsv, doc_len, terms_version,
                         stem_language)
SELECT %(scope)s, %(path)s, %(kind)s, %(title)s, %(tags)s, %(body)s, %(card_key)s, %(card_type)s,
       %(status)s, %(penalised)s, %(session_id)s, %(seq)s, %(hash)s, v.tsv,
       (SELECT coalesce(sum(cardinality(u.positions)), 0) FROM unnest(v.tsv) u),
       %(terms_version)s, %(lang)s
-- The parser's words, their stems in the document's language and the extra words
-- (schemas.vault.terms), by `memory_doc_tsv` (migrations 011 to 013).
FROM (SELECT memory_doc_tsv(%(title)s, %(tags)s, %(body)s, %(max_chars)s, %(x_title)s,
                            %(x_tags)s, %(x_body)s, %(lang)s::regconfig) AS tsv OFFSET 0) v
""" + _ON_CONFLICT


# The same upsert for a batch in one statement: BM25's statistics triggers run once for it.
# The columns go as binary arrays: text arrays cost ~20 us a document to quote here and as
# much to parse in the server (bodies of a few KB).
# `OFFSET 0` keeps the planner from pulling the tsvector's subquery up into its two uses
# (the column and the length), which parsed every document twice: a third of the upsert's
# server time.
_UPSERT_MANY = """
INSERT INTO memory_docs (scope, path, kind, title, tags, body, card_key, card_type, status,
                         penalised, session_id, seq, content_hash, tsv, doc_len, terms_version,
                         stem_language)
SELECT %(scope)s, r.path, r.kind, r.title, r.tags, r.body, r.card_key, r.card_type, r.status,
       r.penalised, r.session_id, r.seq, r.hash, v.tsv,
       (SELECT coalesce(sum(cardinality(u.positions)), 0) FROM unnest(v.tsv) u),
       %(terms_version)s, r.lang
FROM unnest(%(path)b::text[], %(kind)b::text[], %(title)b::text[], %(tags)b::text[],
            %(body)b::text[], %(card_key)b::text[], %(card_type)b::text[], %(status)b::text[],
            %(penalised)b::boolean[], %(session_id)b::text[], %(seq)b::bigint[],
            %(hash)b::text[], %(x_title)b::text[], %(x_tags)b::text[], %(x_body)b::text[],
            %(lang)b::text[])
     AS r(path, kind, title, tags, body, card_key, card_type, status, penalised, session_id,
          seq, hash, x_title, x_tags, x_body, lang)
CROSS JOIN LATERAL (
    SELECT memory_doc_tsv(r.title, r.tags, r.body, %(max_chars)s, r.x_title, r.x_tags,
                          r.x_body, r.lang::regconfig) AS tsv
    OFFSET 0) v
""" + _ON_CONFLICT
_COLUMNS = ("path", "kind", "title", "tags", "body", "card_key", "card_type", "status",
            "penalised", "session_id", "seq", "hash", "x_title", "x_tags", "x_body", "lang")


def doc_language(title: str, body: str) -> str:
    """The language a document's words are stemmed in, by its title and its body's
    beginning."""
    return stem_language(f"{title}\n{body[:SAMPLE_CHARS]}")


def doc_params(doc: IndexDoc, *, scope: str, digest: str | None = None) -> dict[str, Any]:
    """A document's row as the upserts take it: its texts cleaned, its extra search
    words (`x_*`, schemas.vault.terms) and its language (schemas.vault.language) beside
    them."""
    p: dict[str, Any] = doc.model_dump(exclude={"links"})
    for key in ("title", "tags", "body"):
        p[key] = clean_text(p[key])
    p.update(x_title=extra_terms(p["title"]), x_tags=extra_terms(p["tags"]),
             x_body=extra_terms(p["body"][:MAX_INDEXED_CHARS]),
             lang=doc_language(p["title"], p["body"]),
             hash=digest or doc.content_hash(), max_chars=MAX_INDEXED_CHARS, scope=scope,
             terms_version=TERMS_VERSION)
    return p


async def index_document(conn: AsyncConnection, doc: IndexDoc, *, scope: str,
                         embedder: Embedder | None = None) -> bool:
    """Index one document; True when it was new or changed (same hash: nothing is done)."""
    return await index_documents(conn, [doc], scope=scope, embedder=embedder) == 1


async def index_documents(conn: AsyncConnection, docs: Sequence[IndexDoc], *, scope: str,
                          embedder: Embedder | None = None,
                          defer_stats: bool = False,
                          known: Mapping[str, str] | None = None) -> int:
    """Index many documents in one transaction (pipelined statements); with an embedder
    their chunks are embedded and stored too. Documents whose hash is unchanged are not
    touched. Returns how many were new or changed.

    `defer_stats`: the statistics triggers leave BM25's statistics alone for this batch;
    only for a bulk load (activities.vault.bulk), which marks its scope's recount due
    first and recounts at its end.
    `known`: the indexed hashes of the documents' paths as the caller just read them (a
    path absent is not indexed); None: read here. One gone stale meanwhile costs nothing
    wrong: the upsert rewrites a document only when its hash differs."""
    if not docs:
        return 0
    unique = list({d.path: d for d in docs}.values())
    old = (known if known is not None
           else await _hashes_of(conn, [d.path for d in unique], scope))
    params: list[dict[str, Any]] = []
    for doc in unique:
        digest = doc.content_hash()
        if old.get(doc.path) == digest:
            continue
        params.append(doc_params(doc, scope=scope, digest=digest))
    if not params:
        return 0
    changed = {p["path"] for p in params}
    links = [(scope, d.card_key or d.path, dst) for d in unique if d.path in changed
             for dst in sorted(set(d.links)) if dst != (d.card_key or d.path)]
    batch: dict[str, Any] = {c: [p[c] for p in params] for c in _COLUMNS}
    batch.update(scope=scope, max_chars=MAX_INDEXED_CHARS, terms_version=TERMS_VERSION)
    # The batch embeds (in a thread when large) while its documents are written.
    chunks = None if embedder is None else await start_chunks(
        conn, [ChunkSource(p["path"], p["kind"], p["title"], p["body"], p["session_id"],
                           p["penalised"], p["hash"]) for p in params], embedder)
    try:
        async with conn.transaction():
            async with conn.cursor() as cur:
                if defer_stats:
                    await cur.execute("SET LOCAL keel.defer_term_stats = 'on'")
                await cur.execute(_UPSERT_MANY, batch)
                await cur.execute("DELETE FROM memory_links WHERE scope = %s"
                                  " AND src = ANY(%s)",
                                  (scope, sorted({d.card_key or d.path for d in unique
                                                  if d.path in changed})))
                if links:
                    await cur.executemany("INSERT INTO memory_links (scope, src, dst)"
                                          " VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                                          links)
            if chunks is None:  # stale vectors go; the vault worker's beat embeds anew
                await conn.execute("DELETE FROM memory_chunks WHERE scope = %s"
                                   " AND path = ANY(%s)", (scope, sorted(changed)))
            else:
                await store_chunks(conn, await chunks, scope=scope)
    finally:
        if chunks is not None and not chunks.done():
            chunks.cancel()
    return len(params)


async def _hashes_of(conn: AsyncConnection, paths: list[str], scope: str) -> dict[str, str]:
    cur = await conn.execute("SELECT path, content_hash FROM memory_docs"
                             " WHERE scope = %s AND path = ANY(%s)", (scope, paths))
    return {p: h for p, h in await cur.fetchall()}


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
    triggers (and for repairing a database restored from parts). It clears the scope's
    `recount_due` mark.
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
            " total_len = EXCLUDED.total_len, recount_due = false", (scope, scope))


async def indexed_hashes(conn: AsyncConnection, prefix: str = "", *, scope: str
                         ) -> dict[str, str]:
    cur = await conn.execute(
        "SELECT path, content_hash FROM memory_docs WHERE scope = %s AND path LIKE %s",
        (scope, prefix.replace("%", "\\%").replace("_", "\\_") + "%"))
    return {p: h for p, h in await cur.fetchall()}


# The link edges within two hops of the seed cards (hop 1: edges touching a seed; hop 2:
# edges touching a card hop 1 reached), and the cards they reach.
_EDGES = """
WITH e1 AS (
    SELECT src, dst FROM memory_links
    WHERE scope = %(s)s AND (src = ANY(%(k)s) OR dst = ANY(%(k)s))
), hop1 AS (
    SELECT DISTINCT v.x FROM e1, LATERAL (VALUES (e1.src), (e1.dst)) v(x)
    WHERE v.x <> ALL(%(k)s)
), edges AS (
    SELECT src, dst FROM e1
    UNION
    SELECT l.src, l.dst FROM memory_links l
    WHERE l.scope = %(s)s AND (l.src IN (SELECT x FROM hop1) OR l.dst IN (SELECT x FROM hop1))
)"""
_GRAPH_EDGES = _EDGES + "\nSELECT src, dst FROM edges ORDER BY src, dst"
_GRAPH_CARDS = _EDGES + """
SELECT d.path, d.card_key, d.penalised,
       (SELECT count(*) FROM memory_links l WHERE l.scope = d.scope AND l.dst = d.card_key)
FROM memory_docs d
WHERE d.scope = %(s)s AND d.kind = 'card' AND d.card_key IN (
    SELECT v.x FROM edges, LATERAL (VALUES (edges.src), (edges.dst)) v(x)
    WHERE v.x <> ALL(%(k)s))
"""


async def _graph_around(conn: AsyncConnection, seeds: list[str], exclude: set[str],
                        scope: str) -> tuple[list[tuple[str, str]], list[Candidate]]:
    """Every link edge within two hops of the seed cards, and the cards they reach (but
    the seeds and the documents in `exclude`): two statements, one round trip."""
    params = {"k": sorted(seeds), "s": scope}
    async with conn.pipeline():
        edges = await conn.execute(_GRAPH_EDGES, params)
        cards = await conn.execute(_GRAPH_CARDS, params)
    return ([(s, d) for s, d in await edges.fetchall()],
            [Candidate(path=p, card_key=k, penalised=pen, bm25=0.0, coverage=0.0,
                       incoming=inc)
             for p, k, pen, inc in await cards.fetchall() if p not in exclude])


async def _hits(conn: AsyncConnection, lexemes: list[str], ranked: list[Fused],
                scope: str) -> list[MemoryHit]:
    """The hits as shown: a snippet of the best chunk (dense; a chunk shorter than a snippet
    with what follows it) or of the first query word, cut in Python from the returned
    documents only."""
    if not ranked:
        return []
    cur = await conn.execute(
        "SELECT path, kind, title, left(body, %(max)s) FROM memory_docs"
        " WHERE scope = %(scope)s AND path = ANY(%(paths)s)",
        {"paths": [f.path for f in ranked], "scope": scope, "max": SNIPPET_SOURCE_CHARS})
    info = {r[0]: r for r in await cur.fetchall()}
    out = []
    for f in ranked:
        if f.path not in info:
            continue
        _, kind, title, body = info[f.path]
        lo, hi = (f.chunk.start, f.chunk.end) if f.chunk else (0, len(body))
        if f.chunk:  # a short chunk (a heading alone) shows what follows it too
            hi = max(hi, lo + SNIPPET_MAX_CHARS)
        lo, hi = min(lo, len(body)), min(hi, len(body))
        if kind == "card" and not f.chunk:
            a, b = 0, min(len(body), SNIPPET_MAX_CHARS)
        else:
            a, b = snippet_span(body, lexemes, lo, hi, SNIPPET_MAX_CHARS)
        out.append(MemoryHit(
            path=f.path, kind=kind, title=title, snippet=without_markers(body[a:b]),
            score=round(f.score, 6),
            via_link=f.via_link, chunk=f.chunk.chunk if f.chunk else None, start=a, end=b,
            heading=f.chunk.heading if f.chunk else "", components=f.components()))
    return out


async def search(conn: AsyncConnection, query: str, *, scope: str, k: int = 5,
                 kinds: list[str] | None = None, exclude_session: str | None = None,
                 use_graph: bool = True, embedder: Embedder | None = None,
                 use_lexical: bool = True, live_from_seq: int | None = None,
                 spelling: bool = True) -> SearchHits:
    """The k best documents for `query`: BM25 with the graph rerank, fused by reciprocal
    rank with the dense ranking when there is an embedder (`use_lexical=False`: the dense
    ranking alone, for benchmarks).

    `spelling`: a query word memory lacks is searched as the word one edit away that it
    holds (activities.vault.spelling), and the hits say which (`SearchHits.corrected`).

    `exclude_session`: that session's transcript entries are left out; with
    `live_from_seq`, only those from that seq on (its live window: the entries checkpoints
    moved out of it are searched like any other session's).

    Round trips: as the module says."""
    dense_query = None
    if embedder is not None:
        qvec = (await embed_texts(embedder, [query]))[0]
        dense_query = await plan_dense(conn, embedder, qvec, scope=scope, kinds=kinds,
                                       exclude_session=exclude_session,
                                       live_from_seq=live_from_seq, limit=dense_pool(k))
    async with conn.pipeline():
        words = await conn.execute(LEXEMES, lexeme_params(query, scope))
        near = (None if dense_query is None
                else await conn.execute(dense_query.statement, dense_query.params))
    lexemes, written = words_of(await words.fetchall())
    dense: list[DenseHit] = []
    if near is not None and dense_query is not None:
        dense = dense_results(dense_query, await near.fetchall())
    ranked: list[Ranked] = []
    corrected: dict[str, str] = {}
    if use_lexical and spelling:
        corrected = await corrections(conn, written, scope=scope, searched=lexemes)
        lexemes = [corrected.get(w, w) for w in lexemes]
        written = [corrected.get(w, w) for w in written]
    if use_lexical:
        ranked = await lexical_ranking(conn, lexemes, scope=scope, kinds=kinds,
                                       exclude_session=exclude_session, use_graph=use_graph,
                                       pool=candidate_pool(k), live_from_seq=live_from_seq,
                                       written=written)
    if embedder is None:
        fused = [Fused(path=r.path, score=r.score, lexical_rank=i,
                                       lexical=r.score, bm25=r.bm25, hop=r.hop,
                                       via_link=r.via_link)
                 for i, r in enumerate(ranked[:k], start=1)]
    else:
        floor = getattr(embedder, "floor", DENSE_FLOOR) if use_lexical else -1.0
        fused = fuse(ranked, dense, floor=floor)[:k]
    return SearchHits(await _hits(conn, lexemes, fused, scope), corrected)


async def lexical_ranking(conn: AsyncConnection, lexemes: list[str], *, scope: str,
                          kinds: list[str] | None, exclude_session: str | None,
                          use_graph: bool, pool: int,
                          live_from_seq: int | None = None,
                          written: Sequence[str] = ()) -> list[Ranked]:
    """BM25 over the documents, then the graph rerank from the top cards."""
    candidates = await bm25(conn, lexemes, scope=scope, kinds=kinds,
                             exclude_session=exclude_session, pool=pool,
                             live_from_seq=live_from_seq, written=written)
    edges: list[tuple[str, str]] = []
    neighbours: list[Candidate] = []
    if use_graph and candidates:
        ordered = sorted(candidates, key=lambda c: (-base_score(c), c.path))
        seeds = [c.card_key for c in ordered if c.card_key][:GRAPH_SEEDS]
        if seeds:
            edges, neighbours = await _graph_around(conn, seeds,
                                                    {c.path for c in candidates}, scope)
    return rerank(candidates, edges, neighbours, use_graph=use_graph)


async def recall(conn: AsyncConnection, inp: RecallInput, *, scope: str,
                 embedder: Embedder | None = None) -> RecallResult:
    """The `<memory-context>` block for a turn's query ("" when nothing matches): a read of
    the index only, in `scope` (already checked). The session's own messages are left out
    (its window and checkpoint carry them); an input without content words recalls nothing;
    a snippet is shown once. The hits' access count is the caller's to touch. No word is
    corrected: a turn's message is not a search someone typed, and a name memory has not
    met yet would be taken for one it has."""
    if not wants_recall(inp.query):
        return RecallResult(block="", hits=0)
    k = max(1, min(inp.k, MAX_RECALL_K))
    found = await search(conn, inp.query, scope=scope, k=2 * k, kinds=RECALL_KINDS,
                         exclude_session=inp.session_id, embedder=embedder, spelling=False)
    hits = distinct_snippets(found, k)
    return RecallResult(block=fence_memory(hits), hits=len(hits),
                        sources=[h.path for h in hits])


async def touch_documents(conn: AsyncConnection, paths: list[str], *, scope: str) -> None:
    """Count recalls (a path named twice was recalled twice): decay keeps recalled cards
    relevant."""
    if paths:
        await conn.execute(
            "UPDATE memory_docs d SET access_count = d.access_count + c.n, last_access = now()"
            " FROM (SELECT p, count(*) AS n FROM unnest(%s::text[]) p GROUP BY p) c"
            " WHERE d.scope = %s AND d.path = c.p", (paths, scope))


@dataclass(frozen=True)
class MemoryDoc:
    """One document of a scope's index read whole (a day: its entries together)."""

    path: str
    kind: str
    title: str
    body: str
    session_id: str | None = None  # a transcript entry's message
    seq: int | None = None


_DAY_PATH = re.compile(r"daily/\d{4}-\d{2}-\d{2}\.md")


async def read_document(conn: AsyncConnection, path: str, *, scope: str) -> MemoryDoc | None:
    """The document at `path` of `scope`'s index (a card, a summary, a transcript entry
    `daily/DAY.md#SESSION:SEQ`), or a day's transcript (`daily/DAY.md`: its entries in the
    order they were written); None when there is none. What memory_get and `keel vault
    show` read."""
    if _DAY_PATH.fullmatch(path):
        rows = await (await conn.execute(
            "SELECT body FROM memory_docs WHERE scope = %s AND kind = 'daily' AND"
            " starts_with(path, %s) ORDER BY indexed_at, session_id, seq",
            (scope, f"{path}#"))).fetchall()
        return MemoryDoc(path=path, kind="daily", title="",
                         body="\n\n".join(r[0].strip() for r in rows)) if rows else None
    row = await (await conn.execute(
        "SELECT kind, title, body, session_id, seq FROM memory_docs WHERE scope = %s"
        " AND path = %s", (scope, path))).fetchone()
    if row is None:
        return None
    return MemoryDoc(path=path, kind=row[0], title=row[1], body=row[2], session_id=row[3],
                     seq=row[4])
