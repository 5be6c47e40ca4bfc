"""Bulk indexing: many documents into one scope's search index at once (an import, a first
index of a large vault, the benchmarks).

Invariants:
- The result is the one `index_documents` gives document by document: the same rows in
  memory_docs, memory_terms, memory_links and memory_chunks, and an HNSW index over every
  vector of the model at the end (searches find the same documents either way). A path
  given twice is indexed once, as its last version (what one by one would leave).
- Documents go in batches of `BULK_BATCH`, each batch its own transaction on an autocommit
  connection: a failure keeps the batches committed before it, and a retry skips them by
  hash.
- A load large next to its scope (`large_load`) writes its batches on two connections at
  once (the given one and a second to the same server, opened for the load and closed at
  its end), when no two batches share a card's link key; and it counts BM25's statistics
  once, at its end (the batches skip the statistics triggers: `defer_stats`). Its scope's
  `recount_due` mark is committed before the first batch and cleared by the recount, which
  runs however the load ends; a load killed half way leaves the mark, and the scope's next
  bulk load (the doctor's nightly reindex is one) recounts. Meanwhile the statistics lag
  the documents, and only the ranking's weights can differ.
- A load large next to the model's HNSW index sets the index aside and builds it once at the
  end (activities.vault.dense.defer_ann_index); the end runs however the load ends, so the
  index is never left missing by an error here. Meanwhile other scopes' dense searches run
  exact (same order, slower); nothing waits on a lock but the build's own writers. The
  recount and the build run at once, on the two connections. Such a load ends with the term
  statistics vacuumed and the tables analysed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

from psycopg import AsyncConnection
from psycopg.pq import TransactionStatus

from activities.vault import dense
from activities.vault.embedder import Embedder
from activities.vault.search import IndexDoc, index_documents, rebuild_statistics

# Documents per statement batch: the upsert's arrays and a batch of chunks to embed stay a
# few MB.
BULK_BATCH = 2_000


async def index_bulk(conn: AsyncConnection, docs: Sequence[IndexDoc], *, scope: str,
                     embedder: Embedder | None = None, batch: int = BULK_BATCH) -> int:
    """Index `docs` in batches (on two connections, the statistics counted once at the end,
    when the load is large), the vectors' HNSW index built once at the end when the load is
    large next to it; returns how many documents were new or changed."""
    unique = list({d.path: d for d in docs}.values())
    batches = [unique[i:i + batch] for i in range(0, len(unique), batch)]
    was_due = await _recount_due(conn, scope)
    large = await large_load(conn, scope, len(unique))
    deferred = embedder is not None and await dense.defer_ann_index(conn, embedder.name,
                                                                    len(unique))
    helper = None
    changed = 0
    failed = True
    try:
        if large:
            await _mark_due(conn, scope)
            if len(batches) > 1 and _disjoint_link_sources(batches):
                helper = await _second_connection(conn)
            if helper is not None and deferred and embedder is not None:
                await dense.share_deferral(conn, helper, embedder.name)
        changed = await _write(conn, helper, batches, scope=scope, embedder=embedder,
                               defer_stats=large)
        failed = False
    finally:
        try:
            await _finish(conn, helper, scope=scope,
                          model=embedder.name if deferred and embedder else None,
                          recount=was_due or (large and (changed > 0 or failed)),
                          clear=large)
        finally:
            if helper is not None:
                await helper.close()
    if deferred or (large and changed):
        # The statistics' rows were rewritten (by the trigger once a batch, or the recount):
        # their dead rows made a query's term lookups 100x slower (0.7 ms a term at 100,000
        # documents) until autovacuum came by. The planner learns the new sizes too.
        await conn.execute("VACUUM (ANALYZE) memory_terms")
        await conn.execute("ANALYZE memory_docs")
        await conn.execute("ANALYZE memory_chunks")
    return changed


async def large_load(conn: AsyncConnection, scope: str, n: int) -> bool:
    """Whether `n` documents are a large load into `scope`: at least BULK_DEFER_MIN and at
    least BULK_DEFER_SHARE of what the scope holds (a recount of the scope then costs less
    than the statistics triggers of the batches), on an autocommit connection outside a
    transaction (each batch commits on its own)."""
    if (not conn.autocommit or n < dense.BULK_DEFER_MIN
            or conn.info.transaction_status != TransactionStatus.IDLE):
        return False
    row = await (await conn.execute("SELECT n_docs FROM memory_stats WHERE scope = %s",
                                    (scope,))).fetchone()
    return n >= dense.BULK_DEFER_SHARE * (int(row[0]) if row else 0)


async def _recount_due(conn: AsyncConnection, scope: str) -> bool:
    row = await (await conn.execute("SELECT recount_due FROM memory_stats WHERE scope = %s",
                                    (scope,))).fetchone()
    return bool(row and row[0])


async def _mark_due(conn: AsyncConnection, scope: str) -> None:
    await conn.execute(
        "INSERT INTO memory_stats (scope, n_docs, total_len, recount_due)"
        " VALUES (%s, 0, 0, true) ON CONFLICT (scope) DO UPDATE SET recount_due = true",
        (scope,))


def _disjoint_link_sources(batches: list[list[IndexDoc]]) -> bool:
    """No card's link key in two batches (two batches at once must not rewrite the same
    source's links); paths are unique already."""
    seen: set[str] = set()
    for part in batches:
        keys = {d.card_key for d in part if d.card_key}
        if keys & seen:
            return False
        seen |= keys
    return True


async def _second_connection(conn: AsyncConnection) -> AsyncConnection | None:
    """Another autocommit connection with `conn`'s parameters, or None when the server
    refuses one (the load then runs on `conn` alone)."""
    try:
        return await AsyncConnection.connect(conn.info.dsn, password=conn.info.password,
                                             autocommit=True)
    except Exception:
        return None


async def _write(conn: AsyncConnection, helper: AsyncConnection | None,
                 batches: list[list[IndexDoc]], *, scope: str, embedder: Embedder | None,
                 defer_stats: bool) -> int:
    """The batches, in order on one connection, or taken in turn by two (each takes the
    next when its last one is done). After a failure no batch is begun, the other
    connection's batch in flight ends as it would, and the first failure is raised."""
    queue: Iterator[list[IndexDoc]] = iter(batches)
    failed = False

    async def work(c: AsyncConnection) -> int:
        nonlocal failed
        n = 0
        for part in queue:
            if failed:
                break
            try:
                n += await index_documents(c, part, scope=scope, embedder=embedder,
                                           defer_stats=defer_stats)
            except BaseException:
                failed = True
                raise
        return n

    if helper is None:
        return await work(conn)
    results = await asyncio.gather(work(conn), work(helper), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return sum(r for r in results if isinstance(r, int))


async def _finish(conn: AsyncConnection, helper: AsyncConnection | None, *, scope: str,
                  model: str | None, recount: bool, clear: bool) -> None:
    """The load's end: the statistics recounted (or the load's mark cleared when it changed
    nothing) and the HNSW index built; at once when there are two connections (on `conn`
    alone when the second one broke), and the index built even when the recount fails."""
    if helper is not None and helper.broken:
        helper = None

    async def statistics(c: AsyncConnection) -> None:
        if recount:
            await rebuild_statistics(c, scope=scope)
        elif clear:
            await _clear_due(c, scope)

    async def index() -> None:
        if model is not None:
            await dense.restore_ann_index(conn, model)

    if helper is None:
        try:
            await statistics(conn)
        finally:
            await index()
        return
    for result in await asyncio.gather(statistics(helper), index(), return_exceptions=True):
        if isinstance(result, BaseException):
            raise result


async def _clear_due(conn: AsyncConnection, scope: str) -> None:
    await conn.execute("UPDATE memory_stats SET recount_due = false WHERE scope = %s",
                       (scope,))
