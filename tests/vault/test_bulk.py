"""Bulk indexing (activities.vault.bulk) on the real PostgreSQL with pgvector: the same rows
and the same hits as indexing document by document, the HNSW index set aside during a large
load and always built again at its end, even when the load fails half way; a large load's
batches on two connections, its statistics counted once at its end, and recounted by the
next load when it never reached its end."""

import psycopg
import pytest

import activities.vault.search as search_module
from activities.vault import bulk as bulk_module
from activities.vault import dense
from activities.vault.bulk import index_bulk
from activities.vault.embedder import BUILTIN, builtin_available, load_embedder
from activities.vault.search import IndexDoc, index_documents, search

needs_model = pytest.mark.skipif(not builtin_available(),
                                 reason="the embeddings extra is not installed")

TOPICS = ["We adopted a kitten named Miso last weekend.", "The billing migration moves to "
          "Friday.", "Anna prefers tea over coffee.", "The warehouse scanners broke again.",
          "Our trip to Lisbon is booked for May.", "The quarterly tax invoice is overdue."]


def _docs(n: int) -> list[IndexDoc]:
    return [IndexDoc(path=f"notes/{i}.md", kind="note", title=f"note {i}",
                     body=f"## Part {i % 3}\n\n{TOPICS[i % len(TOPICS)]} (entry {i})")
            for i in range(n)]


async def _ann_index(conn: psycopg.AsyncConnection) -> bool:
    cur = await conn.execute("SELECT count(*) FROM pg_indexes WHERE indexname = %s",
                             (dense._index_name(BUILTIN),))
    row = await cur.fetchone()
    return bool(row and row[0])


async def _rows(conn: psycopg.AsyncConnection, scope: str) -> list[tuple]:
    cur = await conn.execute(
        "SELECT path, chunk, heading, start_char, end_char, kind, content_hash,"
        " embedding::text FROM memory_chunks WHERE scope = %s ORDER BY path, chunk", (scope,))
    return await cur.fetchall()


@needs_model
async def test_a_bulk_load_gives_the_rows_and_hits_of_one_by_one_and_rebuilds_the_index(
        database_url, monkeypatch) -> None:
    monkeypatch.setattr(dense, "BULK_DEFER_MIN", 10)
    embedder = load_embedder(BUILTIN)
    docs = _docs(40)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for doc in docs[:8]:  # a scope indexed one document at a time
            await index_documents(conn, [doc], scope="one", embedder=embedder)
        assert await _ann_index(conn)
        seen: list[bool] = []
        real = search_module.store_chunks

        async def watch(*args, **kwargs):  # is the index there while the batches go in?
            seen.append(await _ann_index(conn))
            return await real(*args, **kwargs)

        monkeypatch.setattr(search_module, "store_chunks", watch)
        writers: set[int] = set()
        real_write = bulk_module.index_documents

        async def count(c, *args, **kwargs):  # which connections wrote batches
            writers.add(id(c))
            return await real_write(c, *args, **kwargs)

        monkeypatch.setattr(bulk_module, "index_documents", count)
        assert await index_bulk(conn, docs, scope="bulk", embedder=embedder, batch=7) == 40
        assert len(writers) == 2  # a large load: two connections took the 6 batches
        assert await index_bulk(conn, docs, scope="bulk", embedder=embedder) == 0
        # A path given twice is indexed once, as its last version.
        twice = [docs[0].model_copy(update={"body": "an older text"}), docs[0]]
        assert await index_bulk(conn, twice, scope="bulk", embedder=embedder) == 0
        assert seen and not any(seen)  # 40 chunks against 8 indexed: set aside
        assert await _ann_index(conn)
        for doc in docs[8:]:
            await index_documents(conn, [doc], scope="one", embedder=embedder)
        assert await _rows(conn, "bulk") == await _rows(conn, "one")
        for query in ("a new pet cat", "invoice"):
            one = [h.path for h in await search(conn, query, scope="one", k=5,
                                                embedder=embedder)]
            bulk = [h.path for h in await search(conn, query, scope="bulk", k=5,
                                                 embedder=embedder)]
            assert one == bulk and one
        # these scopes are small, so searched exactly; the HNSW walk finds the same here
        exact = await search(conn, "a new pet cat", scope="bulk", k=3, embedder=embedder,
                             use_lexical=False)
        monkeypatch.setattr(dense, "EXACT_MAX_DOCS", 0)
        walked = await search(conn, "a new pet cat", scope="bulk", k=3, embedder=embedder,
                              use_lexical=False)
        assert [h.path for h in walked] == [h.path for h in exact]
        assert all(int(h.path[6:-3]) % len(TOPICS) == 0 for h in exact)  # the kitten notes
        assert abs(walked[0].components["dense"] - exact[0].components["dense"]) < 2e-3
        terms = "SELECT term, df FROM memory_terms WHERE scope = %s ORDER BY term"
        assert (await (await conn.execute(terms, ("bulk",))).fetchall()
                == await (await conn.execute(terms, ("one",))).fetchall())


@needs_model
async def test_a_failed_bulk_load_still_leaves_the_index_and_small_loads_keep_it(
        database_url, monkeypatch):
    monkeypatch.setattr(dense, "BULK_DEFER_MIN", 10)
    embedder = load_embedder(BUILTIN)
    bad = IndexDoc(path="notes/bad.md", kind="note", title="bad", body="x", seq=2**63)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await index_documents(conn, _docs(3), scope="s", embedder=embedder)
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            await index_bulk(conn, [*_docs(20), bad], scope="s", embedder=embedder, batch=10)
        assert await _ann_index(conn)
        kept = await (await conn.execute("SELECT count(*) FROM memory_docs")).fetchone()
        assert kept == (20,)  # the batches before the failure stay; a retry skips them
        # a load small next to what the index holds goes into it as it stands
        assert not await dense.defer_ann_index(conn, BUILTIN, 9)
        assert await _ann_index(conn)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        assert not await dense.defer_ann_index(conn, BUILTIN, 10_000)  # not autocommit


@needs_model
async def test_a_vault_reindex_loads_in_bulk_what_file_by_file_indexing_gives(
        database_url, tmp_path, monkeypatch) -> None:
    import json
    import shutil

    from tests.vault.support import CORPUS, make_ctx

    monkeypatch.setattr(dense, "BULK_DEFER_MIN", 10)
    base = make_ctx(tmp_path, database_url)
    bulk, one = base.scoped("bulk"), base.scoped("one")
    for ctx in (bulk, one):
        ctx.vault.ensure()
        shutil.copytree(CORPUS / "vault", ctx.vault.root, dirs_exist_ok=True)
    seen: list[bool] = []
    real = search_module.store_chunks
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        async def watch(*args, **kwargs):
            seen.append(await _ann_index(conn))
            return await real(*args, **kwargs)

        monkeypatch.setattr(search_module, "store_chunks", watch)
        changed, removed = await bulk.vault.reindex(conn)  # into an empty index
        monkeypatch.setattr(search_module, "store_chunks", real)
        for rel in one.vault.markdown_files():
            await one.vault.index_file(conn, rel)
        count = "SELECT count(*) FROM memory_docs WHERE scope = %s"
        assert (changed,) == await (await conn.execute(count, ("one",))).fetchone()
        assert removed == 0 and seen and not any(seen)  # the vectors' index set aside
        assert await _ann_index(conn)  # and built again
        assert await _rows(conn, "bulk") == await _rows(conn, "one")
        docs = ("SELECT path, content_hash, doc_len, tsv::text FROM memory_docs"
                " WHERE scope = %s ORDER BY path")
        terms = "SELECT term, df FROM memory_terms WHERE scope = %s ORDER BY term"
        for stmt in (docs, terms):
            assert (await (await conn.execute(stmt, ("bulk",))).fetchall()
                    == await (await conn.execute(stmt, ("one",))).fetchall())
        queries = json.loads((CORPUS / "queries.json").read_text())[:8]
        for q in queries:
            hits = [[h.path for h in await search(conn, q["query"], scope=s, k=5,
                                                  embedder=bulk.vault.embedder)]
                    for s in ("bulk", "one")]
            assert hits[0] == hits[1] and hits[0]
        assert await bulk.vault.reindex(conn) == (0, 0)


async def test_a_load_that_never_reached_its_end_is_recounted_by_the_next(
        database_url, monkeypatch):
    monkeypatch.setattr(dense, "BULK_DEFER_MIN", 10)
    terms = "SELECT term, df FROM memory_terms WHERE scope = %s ORDER BY term"
    stats = "SELECT n_docs, total_len, recount_due FROM memory_stats WHERE scope = %s"
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for doc in _docs(12):  # the statistics the triggers keep, document by document
            await index_documents(conn, [doc], scope="one")
        # A large load killed after its first batch: its mark committed, that batch
        # written without the statistics.
        await bulk_module._mark_due(conn, "k")
        await index_documents(conn, _docs(12), scope="k", defer_stats=True)
        assert await (await conn.execute(terms, ("k",))).fetchall() == []
        assert await (await conn.execute(stats, ("k",))).fetchone() == (0, 0, True)
        assert await index_bulk(conn, [], scope="k") == 0  # nothing to load: it recounts
        want = await (await conn.execute(terms, ("one",))).fetchall()
        assert await (await conn.execute(terms, ("k",))).fetchall() == want
        n_docs, total_len, _ = await (await conn.execute(stats, ("one",))).fetchone()
        assert await (await conn.execute(stats, ("k",))).fetchone() == (n_docs, total_len,
                                                                       False)
        # A large load that changes nothing clears its own mark without a recount.
        assert await index_bulk(conn, _docs(12), scope="k") == 0
        assert (await (await conn.execute(stats, ("k",))).fetchone())[2] is False
