"""memory_search on the real PostgreSQL: the built-in corpus (English and Russian) with
known answers, the graph rerank, IDF, penalties, the index kept current, hybrid mode with
the test stand-in and with the built-in model (skipped without the embeddings extra), chunk
positions, bulk indexing."""

import pytest

from activities.vault.bm25 import bm25_candidates, query_lexemes
from activities.vault.embedder import BUILTIN, builtin_available
from activities.vault.search import (
    HashingEmbedder,
    IndexDoc,
    embed_pending,
    index_documents,
    load_embedder,
    recall,
    search,
)
from schemas.vault.recall import RecallInput
from schemas.vault.search import (
    Candidate,
    recall_at_k,
    reciprocal_rank,
    rerank,
    rrf_fuse,
    stem_prefix,
    term_patterns,
)
from tests.vault.support import load_corpus, vault_ctx


@pytest.fixture
def ctx(tmp_path, database_url):
    return vault_ctx(tmp_path, database_url)


async def _quality(ctx, queries, use_graph):
    pool = await ctx.pool()
    out = {}
    async with pool.connection() as conn:
        for lang in ("en", "ru"):
            qs = [q for q in queries if q["lang"] == lang]
            r5 = mrr = 0.0
            for q in qs:
                paths = [h.path for h in await search(conn, q["query"], scope="default", k=10,
                                                      use_graph=use_graph)]
                r5 += recall_at_k(paths, set(q["relevant"]))
                mrr += reciprocal_rank(paths, set(q["relevant"]))
            out[lang] = (r5 / len(qs), mrr / len(qs))
    return out


async def test_corpus_known_answers_in_english_and_russian(ctx):
    queries = await load_corpus(ctx)
    with_graph = await _quality(ctx, queries, True)
    alone = await _quality(ctx, queries, False)
    for lang in ("en", "ru"):
        recall, mrr = with_graph[lang]
        assert recall >= 0.95 and mrr >= 0.9, (lang, with_graph)
        assert alone[lang][0] >= 0.85, (lang, alone)
        assert recall >= alone[lang][0]


async def test_graph_rerank_surfaces_linked_cards(ctx):
    await load_corpus(ctx)
    pool = await ctx.pool()
    async with pool.connection() as conn:
        hits = await search(conn, "billing migration team", scope="default", k=5)
        plain = await search(conn, "billing migration team", scope="default", k=5, use_graph=False)
    paths = [h.path for h in hits]
    assert paths[0] == "cards/projects/Project Atlas.md"
    anna = next(h for h in hits if h.path == "cards/contacts/Anna Petrova.md")
    assert anna.via_link  # no query word on her card: reached through [[Project Atlas]]
    assert "cards/contacts/Anna Petrova.md" not in [h.path for h in plain]


async def test_rare_words_outrank_common_ones_and_russian_word_forms_match(ctx):
    await load_corpus(ctx)
    pool = await ctx.pool()
    async with pool.connection() as conn:
        cands = await bm25_candidates(conn, "the penicillin", scope="default")
        assert cands[0].path == "cards/notes/Allergy.md"
        # "the" is in many documents: matching it alone covers little of the query.
        assert cands[0].coverage > 0.7
        assert all(c.coverage < 0.3 for c in cands[1:]) and len(cands) > 5
        # "бухгалтеру" (dative) finds "бухгалтер" through the light stem.
        hits = await search(conn, "бухгалтеру", scope="default", k=3)
    assert hits and hits[0].path in ("cards/contacts/Борис Иванов.md", "cards/notes/Ромашка.md")


async def test_superseded_and_stale_cards_sink(ctx):
    vault = ctx.vault
    body = "# {t}\n\n## Facts\n- quarterly tax report goes to the accountant (EXTRACTED)\n"
    for title, status in (("Tax old", "archived"), ("Tax new", "active")):
        vault.write(f"cards/notes/{title}.md",
                    f"---\ntype: note\ntitle: {title}\nstatus: {status}\n---\n"
                    + body.format(t="Tax"))
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await vault.reindex(conn)
        hits = await search(conn, "quarterly tax report", scope="default", k=2)
    assert [h.path for h in hits] == ["cards/notes/Tax new.md", "cards/notes/Tax old.md"]
    assert hits[1].score == pytest.approx(hits[0].score * 0.3, rel=0.01)


async def test_index_follows_file_changes_and_statistics_stay_exact(ctx):
    await load_corpus(ctx)
    vault = ctx.vault
    path = "cards/notes/Allergy.md"
    text = vault.path(path).read_text().replace("penicillin", "amoxicillin")
    vault.write(path, text)
    vault.path("cards/notes/Дача.md").unlink()
    pool = await ctx.pool()
    async with pool.connection() as conn:
        changed, removed = await vault.reindex(conn)
        assert (changed, removed) == (1, 1)
        assert await vault.reindex(conn) == (0, 0)  # nothing changed: nothing re-indexed
        assert not await search(conn, "penicillin", scope="default")
        assert (await search(conn, "amoxicillin", scope="default"))[0].path == path
        # The document-frequency table and corpus statistics match a recount.
        cur = await conn.execute(
            "SELECT count(*) FROM (SELECT lexeme, count(*) AS n FROM memory_docs,"
            " unnest(tsv) GROUP BY lexeme) r FULL JOIN (SELECT * FROM memory_terms"
            " WHERE df > 0) t ON t.term = r.lexeme WHERE t.df IS DISTINCT FROM r.n")
        assert (await cur.fetchone())[0] == 0
        cur = await conn.execute(
            "SELECT s.n_docs = (SELECT count(*) FROM memory_docs) AND s.total_len ="
            " (SELECT sum(doc_len) FROM memory_docs) FROM memory_stats s"
            " WHERE s.scope = 'default'")
        assert (await cur.fetchone())[0] is True


needs_model = pytest.mark.skipif(not builtin_available(),
                                 reason="the embeddings extra is not installed")


async def test_hybrid_with_the_stand_in_fuses_without_any_download(ctx):
    await load_corpus(ctx)
    embedder = load_embedder("hashing")
    assert isinstance(embedder, HashingEmbedder)
    pool = await ctx.pool()
    async with pool.connection() as conn:
        docs = (await (await conn.execute("SELECT count(*) FROM memory_docs")).fetchone())[0]
        assert await embed_pending(conn, embedder, scope="default") == docs
        assert await embed_pending(conn, embedder, scope="default") == 0
        hits = await search(conn, "Petrova", scope="default", k=5, embedder=embedder)
        bm25 = await search(conn, "Petrova", scope="default", k=5)
    assert hits[0].path == bm25[0].path == "cards/contacts/Anna Petrova.md"
    assert len(hits) == 5


@needs_model
async def test_hybrid_finds_a_paraphrase_deep_in_a_long_note_and_says_where(ctx):
    filler = "".join(f"Line {i}: the release checklist item {i} is done.\n" for i in range(300))
    body = (f"# Notes\n{filler}\n## Pets\nOur puppy chewed the sofa cushions again, so we "
            "ordered a sturdier couch.\n")
    doc = IndexDoc(path="notes/long.md", kind="note", title="long", body=body)
    embedder = load_embedder(BUILTIN)
    pool = await ctx.pool()
    async with pool.connection() as conn:
        assert await index_documents(conn, [doc], scope="default", embedder=embedder) == 1
        assert await index_documents(conn, [doc], scope="default", embedder=embedder) == 0
        plain = await search(conn, "dog damaged furniture", scope="default", k=3)
        hits = await search(conn, "dog damaged furniture", scope="default", k=3,
                            embedder=embedder)
    assert plain == []  # no word in common
    (hit,) = hits
    assert hit.path == "notes/long.md" and hit.heading == "Notes > Pets"
    assert hit.start is not None and hit.start > 10_000  # far past the old 4,000 cut
    assert hit.snippet == body[hit.start:hit.end] and "puppy chewed" in hit.snippet
    assert hit.components["dense_rank"] == 1 and "lexical_rank" not in hit.components


@needs_model
async def test_a_card_found_by_its_title_chunk_shows_its_facts(ctx):
    """The dense ranking may find a card by its title heading alone, a chunk of its own
    (chunks never cross a heading) that says nothing: the hit shows what follows it, up to
    the snippet's length, so the card's facts reach the turn."""
    body = ("# Dana Whitfield\n\n## Facts\n- **employer**: Dana works at Contoso now"
            " (EXTRACTED, 2026-12-06)\n\n## History\n- 2026-12-06→2026-12-06: employer: Dana"
            " works at Northwind Traders (EXTRACTED)\n")
    card = IndexDoc(path="cards/contacts/Dana Whitfield.md", kind="card",
                    title="Dana Whitfield", body=body, card_key="Dana Whitfield")
    embedder = load_embedder(BUILTIN)
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await index_documents(conn, [card], scope="default", embedder=embedder)
        (hit,) = await search(conn, "Where does Dana Whitfield work?", scope="default",
                              k=3, embedder=embedder)
    assert hit.heading == "Dana Whitfield" and hit.chunk == 0  # the title heading alone
    assert hit.snippet == body[hit.start:hit.end] and hit.start == 0
    assert "Dana works at Contoso now" in hit.snippet


@needs_model
async def test_bulk_indexing_keeps_vectors_in_step_and_unrelated_queries_recall_nothing(ctx):
    embedder = load_embedder(BUILTIN)
    docs = [IndexDoc(path=f"daily/2026-06-01.md#s:{i}", kind="daily", title="2026-06-01 s",
                     body=f"#### 09:00:0{i % 10} · user · s <!-- keel:s:{i} -->\n\n{text}",
                     session_id="s", seq=i)
            for i, text in enumerate(["We adopted a kitten named Miso last weekend.",
                                      "The billing migration moves to Friday.",
                                      "Anna prefers tea over coffee in the mornings."])]
    pool = await ctx.pool()
    async with pool.connection() as conn:
        assert await index_documents(conn, docs, scope="default", embedder=embedder) == 3
        assert await embed_pending(conn, embedder, scope="default") == 0
        cat = await recall(conn, RecallInput(session_id="other", query="our new cat"),
                           scope="default", embedder=embedder)
        unrelated = await recall(conn, RecallInput(session_id="other",
                                                   query="boiling point of tungsten"),
                                 scope="default", embedder=embedder)
        changed = docs[0].model_copy(update={"body": docs[0].body.replace("kitten", "puppy")})
        assert await index_documents(conn, [changed], scope="default") == 1
        stale = await (await conn.execute(
            "SELECT count(*) FROM memory_chunks WHERE path = %s", (changed.path,))).fetchone()
        assert await embed_pending(conn, embedder, scope="default") == 1
        await conn.execute("DELETE FROM memory_docs WHERE path = %s", (changed.path,))
        left = await (await conn.execute("SELECT count(*) FROM memory_chunks")).fetchone()
    assert cat.sources[0] == docs[0].path
    # The recalled entry shows its heading's time, speaker and session, not its marker.
    assert "#### 09:00:00 · user · s\n" in cat.block and "<!--" not in cat.block
    assert unrelated.block == "" and unrelated.hits == 0
    assert stale == (0,)  # a changed document's old vectors go at once
    assert left == (2,)  # a deleted document's chunks go with it


def test_ranking_rules():
    assert stem_prefix("decisions") == "decisio"
    assert stem_prefix("работает") == "работа"
    assert stem_prefix("anna") is None and stem_prefix("2026-03") is None
    (_, pattern, tsq), = term_patterns(["it's_100%"])
    assert pattern == "it's\\_100\\%" and tsq == "'it''s_100%'"
    a = Candidate(path="a", bm25=10, coverage=1.0, card_key="a")
    b = Candidate(path="b", bm25=10, coverage=0.2, card_key="b", incoming=5)
    c = Candidate(path="c", bm25=10, coverage=1.0, card_key="c", penalised=True)
    n = Candidate(path="n", bm25=0, coverage=0, card_key="n")
    ranked = rerank([a, b, c], edges=[("a", "n")], neighbours=[n])
    by = {r.path: r for r in ranked}
    assert by["a"].score == pytest.approx(10 * 1.3 * 1.5)
    assert by["n"].via_link and by["n"].hop == 1
    assert by["n"].score == pytest.approx(10 * 0.3 * 1.3)
    assert by["c"].score == pytest.approx(10 * 1.3 * 1.5 * 0.3)
    assert by["b"].score > 10 * 0.5 * 1.5  # the incoming-link boost
    plain = rerank([a, b], edges=[("a", "n")], neighbours=[n], use_graph=False)
    assert [r.path for r in plain] == ["a", "b"]
    assert rrf_fuse([["x", "y", "z"], ["y", "z"]]) == ["y", "z", "x"]


@needs_model
async def test_without_pgvector_the_worker_ranks_the_same(database_url):
    """A server without the extension stores plain arrays; the exact search in the worker
    gives the order pgvector's index gives."""
    import psycopg

    embedder = load_embedder(BUILTIN)
    topics = ["kitten adopted from the shelter", "billing migration moved to Friday",
              "tea instead of coffee", "the warehouse scanners broke", "a trip to Lisbon"]
    docs = [IndexDoc(path=f"notes/{i}.md", kind="note", title=f"n{i}", body=t)
            for i, t in enumerate(topics)]
    found = {}
    for kind in ("vector", "real[]"):
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            if kind == "real[]":
                await conn.execute("DELETE FROM memory_docs")
                await conn.execute("DROP INDEX IF EXISTS memory_chunks_hnsw_minilm_l6_static_256")
                await conn.execute("ALTER TABLE memory_chunks ALTER COLUMN embedding"
                                   " TYPE real[] USING embedding::real[]")
            await index_documents(conn, docs, scope="default", embedder=embedder)
            hits = await search(conn, "a new pet cat", scope="default", k=5, embedder=embedder,
                                use_lexical=False)
            found[kind] = [(h.path, round(h.components["dense"], 4)) for h in hits]
    assert found["vector"][0][0] == "notes/0.md"
    assert [p for p, _ in found["real[]"]] == [p for p, _ in found["vector"]]
    assert all(abs(a[1] - b[1]) < 2e-3 for a, b in zip(found["vector"], found["real[]"],
                                                        strict=True))


async def test_bm25_scores_are_okapi_over_weighted_term_counts(ctx) -> None:
    """The SQL's term frequencies (title x3, tags x2, body x1; a long word's light stem
    matching its variants; a word's English stem indexed beside it) give the Okapi BM25 a
    plain computation over the same words gives. A long note's vector, which the table
    stores apart (TOAST), is scored as a short one's is."""
    import math

    from schemas.vault.search import BM25_B, BM25_K1

    filler = " ".join(f"entry{i:04d}" for i in range(600))
    docs = {
        "a.md": ("harvest festival", "harvest", "the harvest came late this harvest year"),
        "b.md": ("notes", "", "a festival of lights, festivals every winter, festival food"),
        "c.md": ("market", "food", "late market food and the harvest moon"),
        "d.md": ("weather", "", "rain all week and no sun at all"),
        "e.md": ("ledger", "", f"the festival food {filler} and the harvest festivals"),
    }
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await index_documents(conn, [IndexDoc(path=p, kind="note", title=t, tags=g, body=b)
                                     for p, (t, g, b) in docs.items()], scope="okapi")
        # Past 2,032 bytes a row's vector is stored compressed or out of line (TOAST).
        cur = await conn.execute("SELECT pg_column_size(tsv) FROM memory_docs"
                                 " WHERE scope = 'okapi' AND path = 'e.md'")
        assert (await cur.fetchone() or (0,))[0] > 2032
        got = {c.path: c.bm25 for c in await bm25_candidates(
            conn, "harvest festival food", scope="okapi")}
        query = await query_lexemes(conn, "harvest festival food", "okapi")

        async def occurrences(config: str, text: str) -> list[str]:
            cur = await conn.execute(f"SELECT u.lexeme FROM unnest(to_tsvector('{config}', %s))"
                                     " u, unnest(u.positions) p", (text,))
            return [r[0] for r in await cur.fetchall()]

        # A document's words: each occurrence of the parser's, and of each English stem
        # the parser did not find itself, weighted as its column.
        words: dict[str, list[tuple[str, float]]] = {}
        for path, fields in docs.items():
            own = [[(w, weight) for w in await occurrences("simple", text)]
                   for text, weight in zip(fields, (3.0, 2.0, 1.0), strict=True)]
            held = {w for ws in own for w, _ in ws}
            stems = [(w, weight) for text, weight in zip(fields, (3.0, 2.0, 1.0), strict=True)
                     for w in await occurrences("english", text) if w not in held]
            words[path] = [o for ws in own for o in ws] + stems
    # "festival" (8 letters) also matches "festivals" by its light stem "festiv", and so
    # does its English stem `festiv` by its own light stem "festi".
    assert query == ["harvest", "festival", "festiv", "food"]
    avgdl = sum(len(ws) for ws in words.values()) / len(words)
    expected: dict[str, float] = {}
    for lexeme in query:
        stem = stem_prefix(lexeme)

        def match(w: str, lexeme: str = lexeme, stem: str | None = stem) -> bool:
            return w.startswith(stem) if stem else w == lexeme

        # A stem's document frequency: its forms' frequencies summed (at most the corpus).
        forms = {w for ws in words.values() for w, _ in ws if match(w)}
        df = min(len(docs), sum(any(w == f for w, _ in ws) for f in forms
                                for ws in words.values()))
        idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
        for path, ws in words.items():
            tf = sum(weight for w, weight in ws if match(w))
            if tf:
                norm = BM25_K1 * (1 - BM25_B + BM25_B * len(ws) / avgdl)
                expected[path] = expected.get(path, 0.0) + idf * tf * (BM25_K1 + 1) / (tf + norm)
    assert set(got) == set(expected)
    for path, score in expected.items():
        assert got[path] == pytest.approx(score, rel=1e-9), path


async def test_the_graph_walk_reaches_two_hops_either_way_and_no_further(ctx):
    """From the best card: its links and the cards linking to it (hop 1), theirs (hop 2);
    a card three links away is not reached."""
    cards = {  # card -> the cards it links to
        "alpha": ["beta"], "beta": ["gamma"], "gamma": ["delta"], "delta": [],
        "epsilon": ["alpha"], "zeta": ["epsilon"],
    }
    docs = [IndexDoc(path=f"cards/notes/{name}.md", kind="card", title=name,
                     body="the quarterly lighthouse survey" if name == "alpha"
                     else f"notes on {name}", card_key=name, links=links)
            for name, links in cards.items()]
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await index_documents(conn, docs, scope="walk")
        hits = await search(conn, "lighthouse survey", scope="walk", k=10)
    hops = {h.path.rsplit("/", 1)[1][:-3]: h.components.get("hop") for h in hits}
    assert hops == {"alpha": 0, "beta": 1, "epsilon": 1, "gamma": 2, "zeta": 2}
    assert all(h.via_link for h in hits if h.path != "cards/notes/alpha.md")
