"""pgvector's HNSW index of a model's vectors, made on first use (activities.vault.dense.
ensure_ann_index): sessions starting together on a fresh database make it once, none of
their recalls failing; once it exists, a connection's first recall does not wait behind
a write of chunks. Real PostgreSQL with pgvector."""

from __future__ import annotations

import asyncio

import psycopg

from activities.vault.dense import _index_name, ensure_ann_index

MODEL = "race-model"


async def test_connections_starting_together_make_the_index_once(database_url):
    conns = [await psycopg.AsyncConnection.connect(database_url, autocommit=True)
             for _ in range(8)]
    try:
        results = await asyncio.gather(*(ensure_ann_index(c, MODEL, 256) for c in conns),
                                       return_exceptions=True)
    finally:
        for c in conns:
            await c.close()
    assert results == [None] * 8  # before: "duplicate key value violates unique
    # constraint pg_class_relname_nsp_index" for all but one, or a deadlock
    with psycopg.connect(database_url) as conn:
        made = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s",
                            (_index_name(MODEL),)).fetchall()
    assert len(made) == 1 and "hnsw" in made[0][0]


async def test_an_index_there_is_not_made_again_behind_a_writer(database_url):
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as first:
        await ensure_ann_index(first, MODEL, 256)
    async with await psycopg.AsyncConnection.connect(database_url) as writer, \
            await psycopg.AsyncConnection.connect(database_url, autocommit=True) as reader:
        await writer.execute("DELETE FROM memory_chunks WHERE false")  # its lock held, open
        # CREATE INDEX IF NOT EXISTS would wait for the writer's end (its SHARE lock first)
        await asyncio.wait_for(ensure_ann_index(reader, MODEL, 256), 5)
        await writer.rollback()
