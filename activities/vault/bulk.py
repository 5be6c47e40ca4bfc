"""Bulk indexing: many documents into one scope's search index at once (an import, a first
index of a large vault, the benchmarks).

Invariants:
- The result is the one `index_documents` gives document by document: the same rows in
  memory_docs, memory_terms, memory_links and memory_chunks, and an HNSW index over every
  vector of the model at the end (searches find the same documents either way).
- Documents go in batches of `BULK_BATCH`, each batch its own transaction on an autocommit
  connection: a failure keeps the batches before it, and a retry skips them by hash.
- A load large next to the model's HNSW index sets the index aside and builds it once at the
  end (activities.vault.dense.defer_ann_index); the end runs however the load ends, so the
  index is never left missing by an error here. Meanwhile other scopes' dense searches run
  exact (same order, slower); nothing waits on a lock but the build's own writers. Such a
  load ends with the term statistics vacuumed and the tables analysed.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import AsyncConnection

from activities.vault.dense import defer_ann_index, restore_ann_index
from activities.vault.embedder import Embedder
from activities.vault.search import IndexDoc, index_documents

# Documents per statement batch: the upsert's arrays and a batch of chunks to embed stay a
# few MB, and BM25's statistics trigger runs once per batch.
BULK_BATCH = 2_000


async def index_bulk(conn: AsyncConnection, docs: Sequence[IndexDoc], *, scope: str,
                     embedder: Embedder | None = None, batch: int = BULK_BATCH) -> int:
    """Index `docs` in batches, the vectors' HNSW index built once at the end when the load
    is large; returns how many documents were new or changed."""
    deferred = embedder is not None and await defer_ann_index(conn, embedder.name, len(docs))
    changed = 0
    try:
        for start in range(0, len(docs), batch):
            changed += await index_documents(conn, docs[start:start + batch], scope=scope,
                                             embedder=embedder)
    finally:
        if deferred and embedder is not None:
            await restore_ann_index(conn, embedder.name)
    if deferred:
        # The statistics trigger updated each term's row once a batch: the dead rows made a
        # query's term lookups 100x slower (0.7 ms a term at 100,000 documents) until
        # autovacuum came by. The planner learns the new sizes too.
        await conn.execute("VACUUM (ANALYZE) memory_terms")
        await conn.execute("ANALYZE memory_docs")
        await conn.execute("ANALYZE memory_chunks")
    return changed
