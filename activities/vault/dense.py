"""The dense index: every search document as chunks with vectors, in PostgreSQL.

Invariants:
- memory_chunks holds, per scope and document, the chunks of the document as it is now
  (`content_hash` = the document's) from one embedder (`model`): writing a document's
  chunks first deletes every chunk it had, of any model; a document deleted from
  memory_docs takes its chunks with it (foreign key). A vector of one model is never
  compared with another's (every search filters by `model`).
- Every statement carries the scope, as everything of long memory does.
- The search runs in SQL where the server has pgvector (cosine distance, `<=>`), else the
  worker reads the scope's vectors and ranks them exactly with numpy; both give the same
  order. Embedding is CPU work and runs off the event loop when the batch is large
  (`prepare_chunks` touches no connection, so a batch embeds while its documents are
  written).
- pgvector's HNSW index over a model's vectors exists whenever its rows do, except while a
  bulk load has set it aside (`defer_ann_index`, on an autocommit connection only, and
  `share_deferral` for a second connection writing the same load; the load ends with
  `restore_ann_index`, and any later write or search on a new connection makes it again):
  dense searches meanwhile run exact.
"""

from __future__ import annotations

import asyncio
import functools
import re
import struct
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

from psycopg import AsyncConnection, sql
from psycopg.adapt import Dumper
from psycopg.pq import Format

from activities.vault.embedder import Embedder
from schemas.vault.chunks import Chunk, chunk_document
from schemas.vault.search import DenseHit

# Chunks embedded in one go off the event loop (and how many pending documents a beat takes).
EMBED_BATCH = 512
# A batch smaller than this is embedded on the event loop (a query, a turn's messages).
INLINE_TEXTS = 64

# The HNSW search's candidate list (pgvector's hnsw.ef_search); iterative scans go on past
# it when filters (scope, kinds, session) drop rows.
EF_SEARCH = 100
# A scope of at most this many documents is searched exactly (its rows by the (scope, model)
# index, ~1 us a chunk): in a table shared with larger scopes the filtered graph walk
# visits many other scopes' vectors first, and its random levels made the hits differ from
# build to build. The size is looked up at most every SIZE_TTL_S seconds per connection.
EXACT_MAX_DOCS = 2_000
SIZE_TTL_S = 30.0
# The graph's build: half-precision vectors and a lighter graph than pgvector's defaults
# (16, 64) make each insert ~3x cheaper (bulk indexing is bound by it); the fusion takes 50
# documents, so the small loss of recall at the far end of the list does not show.
HNSW_M = 12
HNSW_EF_CONSTRUCTION = 40
# A bulk load sets a model's HNSW index aside and builds it once at its end when it brings
# at least this many chunks and at least this share of what the index holds: pgvector
# builds a graph ~4x cheaper than it inserts into one (0.8, 9,600 vectors: 1.1 s against
# 4.9 s of server CPU), and the build may run in parallel.
BULK_DEFER_MIN = 2_000
BULK_DEFER_SHARE = 0.5
# The build's memory: the graph of 100,000 chunks needs ~100 MB (past it pgvector builds on
# disk, several times slower).
BUILD_MEMORY = "512MB"


class ChunkSource(NamedTuple):
    """What chunking and filtering need of one document."""

    path: str
    kind: str
    title: str
    body: str
    session_id: str | None
    penalised: bool
    content_hash: str


@dataclass
class _ConnState:
    """What this module learnt about one connection (looked up once per connection:
    reading `conn.info.dsn` on every call cost half a millisecond)."""

    vector_type: str
    vector_oid: int = 0
    dumper: bool = False
    ann: set[str] = field(default_factory=set)
    deferred: dict[str, int] = field(default_factory=dict)  # model -> dims (0: none yet)
    ef_search: int | None = None
    sizes: dict[str, tuple[float, int]] = field(default_factory=dict)  # scope -> (when, docs)


_state: weakref.WeakKeyDictionary[AsyncConnection, _ConnState] = weakref.WeakKeyDictionary()


async def _conn_state(conn: AsyncConnection) -> _ConnState:
    state = _state.get(conn)
    if state is None:
        cur = await conn.execute(
            "SELECT format_type(atttypid, atttypmod), to_regtype('vector')::oid"
            " FROM pg_attribute"
            " WHERE attrelid = 'memory_chunks'::regclass AND attname = 'embedding'")
        row = await cur.fetchone()
        kind = "vector" if row and row[0].startswith("vector") else "real[]"
        state = _state[conn] = _ConnState(kind, int(row[1] or 0) if row else 0)
    return state


async def vector_type(conn: AsyncConnection) -> str:
    """'vector' (pgvector) or 'real[]': how this database stores embeddings."""
    return (await _conn_state(conn)).vector_type


def _index_name(model: str) -> str:
    return "memory_chunks_hnsw_" + re.sub(r"[^a-z0-9]+", "_", model.lower())[:40]


# The advisory lock class of the HNSW indexes' creation (the key: the index name's hash).
_ANN_LOCK_CLASS = 7_246_003


async def ensure_ann_index(conn: AsyncConnection, model: str, dims: int) -> None:
    """pgvector's HNSW index (cosine) over one model's vectors, made on first use: an
    expression index at the model's dimensions, partial on its name.

    Looked up first (a catalog read): `CREATE INDEX IF NOT EXISTS` takes a SHARE lock on
    the table before it looks, so each new connection's first recall would wait behind
    every write of chunks. Made by one connection at a time: concurrent creations of one
    name collide in the catalog (a unique violation, or a deadlock "while inserting index
    tuple"), which failed the first recalls of sessions starting together on a fresh
    database."""
    state = await _conn_state(conn)
    if model in state.ann or state.vector_type != "vector":
        return
    name = _index_name(model)
    if not await _relation_exists(conn, name):
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                               (_ANN_LOCK_CLASS, name))
            await conn.execute(sql.SQL(
                "CREATE INDEX IF NOT EXISTS {} ON memory_chunks USING hnsw"
                " ((embedding::halfvec({})) halfvec_cosine_ops)"
                " WITH (m = {}, ef_construction = {}) WHERE model = {}").format(
                    sql.Identifier(name), sql.Literal(dims), sql.Literal(HNSW_M),
                    sql.Literal(HNSW_EF_CONSTRUCTION), sql.Literal(model)))
    state.ann.add(model)


async def _relation_exists(conn: AsyncConnection, name: str) -> bool:
    # (`_index_name` gives lower-case letters, digits and underscores: no quoting needed)
    row = await (await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,))).fetchone()
    return bool(row and row[0])


def _literal(vec: Sequence[float]) -> str:
    return "[" + ",".join(f"{x:.6g}" for x in vec) + "]"


async def embed_texts(embedder: Embedder, texts: list[str]) -> list[list[float]]:
    if len(texts) <= INLINE_TEXTS:
        return embedder.embed(texts)
    return await asyncio.to_thread(embedder.embed, texts)


def _embed_binary(embedder: Embedder, texts: list[str]) -> list[bytes]:
    """The texts' vectors in pgvector's binary form (dims, 0, big-endian float4s)."""
    import numpy as np

    array = getattr(embedder, "embed_array", None)
    matrix = np.asarray(array(texts) if array else embedder.embed(texts), dtype=">f4")
    head = struct.pack(">HH", matrix.shape[1] if matrix.ndim == 2 else 0, 0)
    return [head + row.tobytes() for row in matrix]


class VectorBytes(bytes):
    """A vector already in pgvector's binary form (sent as is: formatting 256 floats as
    text cost more than embedding them)."""


class _VectorDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


async def _binary_vectors(conn: AsyncConnection) -> bool:
    """Register the binary vector dumper on this connection; False without numpy."""
    try:
        import numpy  # noqa: F401
    except ImportError:
        return False
    state = await _conn_state(conn)
    if not state.dumper:
        dumper = type("VectorDumper", (_VectorDumper,), {"oid": state.vector_oid})
        conn.adapters.register_dumper(VectorBytes, dumper)
        state.dumper = True
    return True


_CHUNK_COLUMNS = ("scope, path, chunk, heading, start_char, end_char, kind, session_id,"
                  " penalised, model, content_hash, embedding")
_CHUNK_TYPES = ("text", "text", "int4", "text", "int4", "int4", "text", "text", "bool", "text",
                "text")


@dataclass
class PreparedChunks:
    """Documents chunked and embedded, ready to store (`store_chunks`)."""

    docs: Sequence[ChunkSource]
    rows: list[tuple[ChunkSource, Chunk, Any]]  # the document, its chunk, the vector
    model: str
    dims: int
    binary: bool  # vectors in pgvector's binary form (else text literals or float lists)


def prepare_chunks(docs: Sequence[ChunkSource], embedder: Embedder, *, pg_vector: bool,
                   binary: bool) -> PreparedChunks:
    """Chunk and embed: CPU work only, no connection (it may run in a thread beside a
    statement on the connection)."""
    pairs = [(doc, c) for doc in docs for c in chunk_document(doc.kind, doc.title, doc.body)]
    texts = [c.text for _, c in pairs]
    vectors: Sequence[Any]
    if not texts:
        vectors, dims = [], 0
    elif binary:
        vectors = [VectorBytes(b) for b in _embed_binary(embedder, texts)]
        dims = (len(vectors[0]) - 4) // 4
    else:
        vectors = embedder.embed(texts)
        dims = len(vectors[0]) if vectors else 0
        if pg_vector:
            vectors = [_literal(v) for v in vectors]
    return PreparedChunks(docs, [(d, c, v) for (d, c), v in zip(pairs, vectors, strict=True)],
                          embedder.name, dims, binary)


async def start_chunks(conn: AsyncConnection, docs: Sequence[ChunkSource],
                       embedder: Embedder) -> asyncio.Future[PreparedChunks]:
    """`prepare_chunks` begun: on the event loop for a few texts, else in a thread, so the
    caller's next statement runs while the batch embeds. Asks the connection only before
    it returns."""
    pg_vector = await vector_type(conn) == "vector"
    binary = pg_vector and await _binary_vectors(conn)
    job = functools.partial(prepare_chunks, docs, embedder, pg_vector=pg_vector,
                            binary=binary)
    if len(docs) <= INLINE_TEXTS:
        done: asyncio.Future[PreparedChunks] = asyncio.get_running_loop().create_future()
        done.set_result(job())
        return done
    return asyncio.ensure_future(asyncio.to_thread(job))


async def store_chunks(conn: AsyncConnection, prepared: PreparedChunks, *, scope: str) -> int:
    """Replace the documents' chunks with the prepared ones; returns how many were written.
    With pgvector the rows go in by one binary COPY (an INSERT a row cost ~0.1 ms of this
    process's time each)."""
    state = await _conn_state(conn)
    pg_vector = state.vector_type == "vector"
    if pg_vector and prepared.dims:
        if prepared.model in state.deferred:  # a bulk load builds the index at its end
            state.deferred[prepared.model] = prepared.dims
        else:
            await ensure_ann_index(conn, prepared.model, prepared.dims)
    params = [(scope, d.path, c.index, c.heading, c.start, c.end, d.kind, d.session_id,
               d.penalised, prepared.model, d.content_hash, v) for d, c, v in prepared.rows]
    async with conn.transaction():
        await conn.execute("DELETE FROM memory_chunks WHERE scope = %s AND path = ANY(%s)",
                           (scope, [d.path for d in prepared.docs]))
        async with conn.cursor() as cur:
            if prepared.binary:
                async with cur.copy(f"COPY memory_chunks ({_CHUNK_COLUMNS})"
                                    " FROM STDIN (FORMAT BINARY)") as copy:
                    copy.set_types([*_CHUNK_TYPES, state.vector_oid])
                    for row in params:
                        await copy.write_row(row)
            elif params:
                cast = "::vector" if pg_vector else "::real[]"
                await cur.executemany(
                    f"INSERT INTO memory_chunks ({_CHUNK_COLUMNS}) VALUES"
                    f" (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s{cast})", params)
    return len(params)


async def write_chunks(conn: AsyncConnection, docs: Sequence[ChunkSource], embedder: Embedder,
                       *, scope: str) -> int:
    """Chunk, embed and store these documents (their old chunks replaced); returns the
    number of chunks written."""
    if not docs:
        return 0
    return await store_chunks(conn, await (await start_chunks(conn, docs, embedder)),
                              scope=scope)


async def defer_ann_index(conn: AsyncConnection, model: str, expected: int) -> bool:
    """Before a bulk load of about `expected` chunks: set the model's HNSW index aside when
    the load is large next to what it holds (`restore_ann_index` builds it again, once).
    Only on an autocommit connection, so each batch commits on its own: meanwhile dense
    searches run exact (same order, slower) and nothing waits on a lock."""
    state = await _conn_state(conn)
    if state.vector_type != "vector" or not conn.autocommit or expected < BULK_DEFER_MIN:
        return False
    cur = await conn.execute("SELECT count(*) FROM memory_chunks WHERE model = %s", (model,))
    row = await cur.fetchone()
    if expected < BULK_DEFER_SHARE * (int(row[0]) if row else 0):
        return False
    await conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(
        sql.Identifier(_index_name(model))))
    state.ann.discard(model)
    state.deferred[model] = 0
    return True


async def share_deferral(conn: AsyncConnection, other: AsyncConnection, model: str) -> None:
    """`other` writes batches of the bulk load `conn` began with `defer_ann_index`: its
    chunks go in without making the index again (`conn` builds it at the end)."""
    source, target = await _conn_state(conn), await _conn_state(other)
    if model in source.deferred:
        target.ann.discard(model)
        target.deferred[model] = source.deferred[model]


async def restore_ann_index(conn: AsyncConnection, model: str) -> None:
    """End a bulk load `defer_ann_index` began: the model's HNSW index built in one pass
    (with room for the graph in memory; the build runs in parallel where it may)."""
    state = await _conn_state(conn)
    dims = state.deferred.pop(model, 0)
    if not dims:
        cur = await conn.execute("SELECT vector_dims(embedding) FROM memory_chunks"
                                 " WHERE model = %s LIMIT 1", (model,))
        row = await cur.fetchone()
        dims = int(row[0]) if row else 0
    if not dims:
        return
    async with conn.transaction():
        await conn.execute(sql.SQL("SET LOCAL maintenance_work_mem = {}").format(
            sql.Literal(BUILD_MEMORY)))
        await ensure_ann_index(conn, model, dims)


async def embed_pending(conn: AsyncConnection, embedder: Embedder, batch: int = EMBED_BATCH,
                        limit: int | None = None, *, scope: str) -> int:
    """Embed the documents whose chunks are missing, stale or of another model (at most
    `limit`), whole: no length is cut off. Returns how many documents were embedded."""
    done = 0
    while limit is None or done < limit:
        take = batch if limit is None else min(batch, limit - done)
        cur = await conn.execute(
            "SELECT d.path, d.kind, d.title, d.body, d.session_id, d.penalised, d.content_hash"
            " FROM memory_docs d WHERE d.scope = %s AND NOT EXISTS (SELECT 1 FROM"
            " memory_chunks c WHERE c.scope = d.scope AND c.path = d.path AND c.chunk = 0"
            " AND c.model = %s AND c.content_hash = d.content_hash) ORDER BY d.path LIMIT %s",
            (scope, embedder.name, take))
        docs = [ChunkSource(*r) for r in await cur.fetchall()]
        if not docs:
            break
        await write_chunks(conn, docs, embedder, scope=scope)
        done += len(docs)
    return done


async def _hnsw_settings(conn: AsyncConnection, ef_search: int) -> None:
    """The HNSW search's settings on this connection, set once (session settings that only
    pgvector's index scans read): iterative scans, so filters never starve the result."""
    state = await _conn_state(conn)
    if state.ef_search != ef_search:
        await conn.execute(sql.SQL(
            "SET hnsw.ef_search = {}; SET hnsw.iterative_scan = relaxed_order").format(
                sql.Literal(ef_search)))
        state.ef_search = ef_search


@dataclass
class DenseQuery:
    """A dense search ready to send: its statement and parameters (the caller may pipeline
    it beside other statements) and what turns its rows into hits (`dense_results`)."""

    statement: bytes | str
    params: dict[str, Any]
    qvec: list[float]
    limit: int
    in_worker: bool  # no pgvector: the rows carry their vectors and are ranked here


async def plan_dense(conn: AsyncConnection, embedder: Embedder, qvec: list[float], *,
                     scope: str, kinds: list[str] | None = None,
                     exclude_session: str | None = None, limit: int = 50,
                     live_from_seq: int | None = None) -> DenseQuery | None:
    """The search for the documents nearest `qvec` (the query's vector), or None for a
    query with no vector. Settles the connection's settings first (statements only the
    first time a connection sees a model or a scope)."""
    if not any(qvec):
        return None
    filters = ("scope = %(scope)s AND model = %(model)s"
               " AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))"
               " AND (%(ex)s::text IS NULL OR session_id IS DISTINCT FROM %(ex)s::text"
               # The excluded session's entries checkpoints moved out of its window.
               " OR EXISTS (SELECT 1 FROM memory_docs d WHERE d.scope = %(scope)s"
               " AND d.path = memory_chunks.path AND d.seq < %(ex_from)s::bigint))")
    params: dict[str, Any] = {"scope": scope, "model": embedder.name, "kinds": kinds,
                              "ex": exclude_session, "ex_from": live_from_seq,
                              "n": 2 * limit}
    if await vector_type(conn) != "vector":
        return DenseQuery(
            "SELECT path, chunk, start_char, end_char, heading, penalised, embedding"
            " FROM memory_chunks WHERE " + filters, params, qvec, limit, True)
    dims = len(qvec)
    await ensure_ann_index(conn, embedder.name, dims)
    binary = await _binary_vectors(conn)
    params["q"] = (VectorBytes(struct.pack(f">HH{dims}f", dims, 0, *qvec)) if binary
                   else _literal(qvec))
    exact = await _scope_docs(conn, scope) <= EXACT_MAX_DOCS
    if not exact:
        await _hnsw_settings(conn, max(EF_SEARCH, params["n"]))
    return DenseQuery(_ann_statement(embedder.name, dims, filters, binary, exact), params,
                      qvec, limit, False)


def dense_results(query: DenseQuery, rows: list[tuple[Any, ...]]) -> list[DenseHit]:
    """The documents of a dense search's rows, each by its best chunk, best first (at most
    `limit` documents, from the `2 * limit` nearest chunks)."""
    if query.in_worker:
        rows = _rank_in_worker(rows, query.qvec, query.params["n"])
    else:
        rows = sorted(rows, key=lambda r: (-r[6], r[0], r[1]))
    out: dict[str, DenseHit] = {}
    for path, chunk, start, end, heading, penalised, sim in rows:
        if path not in out:
            out[path] = DenseHit(
                path=path, similarity=float(sim), chunk=chunk, start=start, end=end,
                heading=heading, penalised=penalised)
    return list(out.values())[:query.limit]


async def dense_hits(conn: AsyncConnection, embedder: Embedder, query: str, *, scope: str,
                     kinds: list[str] | None = None, exclude_session: str | None = None,
                     limit: int = 50) -> list[DenseHit]:
    """The documents nearest the query, each by its best chunk, best first (at most
    `limit` documents, from the `2 * limit` nearest chunks; approximate, by HNSW, where the
    server has pgvector)."""
    qvec = (await embed_texts(embedder, [query]))[0]
    plan = await plan_dense(conn, embedder, qvec, scope=scope, kinds=kinds,
                            exclude_session=exclude_session, limit=limit)
    if plan is None:
        return []
    cur = await conn.execute(plan.statement, plan.params)
    return dense_results(plan, await cur.fetchall())


async def _scope_docs(conn: AsyncConnection, scope: str) -> int:
    """How many documents the scope holds (BM25's statistics row), cached briefly."""
    state = await _conn_state(conn)
    now = time.monotonic()
    seen = state.sizes.get(scope)
    if seen is None or now - seen[0] > SIZE_TTL_S:
        cur = await conn.execute("SELECT n_docs FROM memory_stats WHERE scope = %s", (scope,))
        row = await cur.fetchone()
        seen = state.sizes[scope] = (now, int(row[0]) if row else 0)
    return seen[1]


@lru_cache(maxsize=16)
def _ann_statement(model: str, dims: int, filters: str, binary: bool, exact: bool) -> bytes:
    """The dense search statement, composed once (the same bytes each time, so psycopg
    prepares it). HNSW: the model's name and dimensions are literals, as the planner must
    see them to use the partial expression index. Exact: cosine of the stored vectors,
    ordered by an expression no index serves."""
    ph = "%(q)b" if binary else "%(q)s"
    distance = ("embedding <=> " + ph + "::vector" if exact
                else "embedding::halfvec({d}) <=> " + ph + "::halfvec({d})")
    order = f"({distance}) + 0" if exact else distance
    return sql.SQL(
        "SELECT path, chunk, start_char, end_char, heading, penalised,"
        " 1 - (" + distance + ") FROM memory_chunks"
        " WHERE model = {m} AND " + filters.replace("model = %(model)s AND ", "") +
        " ORDER BY " + order + " LIMIT %(n)s").format(
            d=sql.Literal(dims), m=sql.Literal(model)).as_string().encode()


def _rank_in_worker(rows: list[tuple[Any, ...]], qvec: list[float], n: int
                    ) -> list[tuple[Any, ...]]:
    """Without pgvector: every vector of the scope, read by the statement, ranked here
    (exact)."""
    import numpy as np

    if not rows:
        return []
    matrix = np.asarray([r[6] for r in rows], dtype=np.float32)
    sims = matrix @ np.asarray(qvec, dtype=np.float32)
    order = sorted(range(len(rows)), key=lambda i: (-sims[i], rows[i][0], rows[i][1]))
    return [(*rows[i][:6], float(sims[i])) for i in order[:n]]
