"""A misspelt search finds what was said (activities.vault.spelling on the real
PostgreSQL): a word memory lacks is searched as the word one edit away that it holds, the
hits say so, a word memory holds is never corrected, the turn's recall corrects nothing,
and another scope's words are never used."""

import asyncio

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activities.vault.bm25 import query_lexemes
from activities.vault.search import (
    IndexDoc,
    index_documents,
    recall,
    search,
)
from activities.vault.spelling import MAX_CANDIDATES, corrections
from schemas.vault.recall import RecallInput
from schemas.vault.search import stem_prefix
from schemas.vault.spelling import one_edit
from tests.vault.support import vault_ctx

SAID = {
    "notes/shipment.md": "We receive the shipment from Rotterdam on Friday morning.",
    "notes/deploy.md": "The deployment runbook lives in the ops repository.",
    "notes/nicholas.md": "Nicholas moved to Berlin and starts at the clinic in March.",
    "notes/relief.md": "The relief fund pays out twice a year.",
    "notes/form.md": "Fill in the tax form before you leave the office.",
    "notes/from.md": "A letter came from the bank about the mortgage.",
    "notes/budget.md": "Квартальный бюджет утвердили в понедельник.",
    "notes/cafe.md": "Meet at the cafe by the station.",
    "notes/decision.md": "The board's decision was postponed until spring.",
    "notes/long.md": "internationalisations counterrevolutionaries electroencephalographs",
}


@pytest.fixture
def ctx(tmp_path, database_url):
    return vault_ctx(tmp_path, database_url)


async def _indexed(ctx, scope="default"):
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await index_documents(conn, [IndexDoc(path=p, kind="daily", body=b)
                                     for p, b in SAID.items()], scope=scope)
    return pool


async def test_a_misspelt_word_finds_what_was_said(ctx):
    pool = await _indexed(ctx)
    async with pool.connection() as conn:
        for query, path, corrected in [
            ("recieve shipment", "notes/shipment.md", {"recieve": "receive"}),  # swapped
            ("recieve", "notes/shipment.md", {"recieve": "receive"}),
            # `runbok` is found by its light stem's prefix (runbo-) as it is: not corrected.
            ("deploymnet runbok", "notes/deploy.md", {"deploymnet": "deployment"}),
            ("shpment", "notes/shipment.md", {"shpment": "shipment"}),  # dropped
            ("Nicolas Berlin", "notes/nicholas.md", {"nicolas": "nicholas"}),
            ("Rottterdam", "notes/shipment.md", {"rottterdam": "rotterdam"}),  # doubled
            ("бьюджет", "notes/budget.md", {"бьюджет": "бюджет"}),  # Cyrillic
            # No word one edit away is held as it is; `decisions` is, by its stem's
            # prefix (decisio-), as BM25 would find `decision`: searched as that word
            # (and the misspelt word's own English stem, decison, finds it already).
            ("decisons", "notes/decision.md", {"decisons": "decision"}),
        ]:
            hits = await search(conn, query, scope="default", k=3)
            assert [h.path for h in hits][:1] == [path], query
            assert hits.corrected == corrected, query
            note = hits.spelling_note()
            assert all(f'"{new}" for "{old}"' in note for old, new in corrected.items())
            # The snippet is cut around the word searched.
            assert next(iter(corrected.values())) in hits[0].snippet.lower(), query
            # Without the correction a misspelt word alone finds nothing.
            plain = await search(conn, query, scope="default", k=3, spelling=False)
            assert plain.corrected == {}
            if " " not in query and query != "decisons":
                assert list(plain) == [], query


async def test_a_word_memory_holds_is_searched_as_written(ctx):
    pool = await _indexed(ctx)
    async with pool.connection() as conn:
        # `form` is held (and one edit from the held `from`): never corrected.
        hits = await search(conn, "form", scope="default", k=3)
        assert hits.corrected == {} and hits.spelling_note() == ""
        assert [h.path for h in hits][:1] == ["notes/form.md"]
        # A long word held by its light stem's prefix (as BM25 finds it) is held.
        assert await corrections(conn, ["deployments", "receives"], scope="default") == {}
        # A word nothing one edit away is held as: nothing searched instead, nothing found.
        hits = await search(conn, "xylophone", scope="default", k=3)
        assert hits.corrected == {} and list(hits) == []
        # Numbers, short words and scripts without spaces are not corrected.
        assert await corrections(conn, ["4821", "frm", "数据库"], scope="default") == {}


async def test_another_scopes_words_are_never_used(ctx):
    await _indexed(ctx, scope="alice")
    pool = await _indexed(ctx, scope="default")
    async with pool.connection() as conn:
        # (`relief` goes too: `relieve`, one edit away, finds it by its stem's prefix.)
        await conn.execute("DELETE FROM memory_docs WHERE scope = 'default'"
                           " AND path IN ('notes/shipment.md', 'notes/relief.md')")
        # `receive` is alice's word now, not default's.
        assert await corrections(conn, ["recieve"], scope="default") == {}
        assert await corrections(conn, ["recieve"], scope="alice") == {"recieve": "receive"}


async def test_the_turns_recall_corrects_nothing(ctx):
    pool = await _indexed(ctx)
    async with pool.connection() as conn:
        query = "deploymnet Rottterdam"
        assert (await search(conn, query, scope="default", k=3)).corrected
        got = await recall(conn, RecallInput(session_id="s-1", query=query), scope="default")
        assert got.hits == 0 and got.block == "", got


async def test_the_correction_is_bounded_and_says_only_what_is_new(ctx):
    pool = await _indexed(ctx)
    async with pool.connection() as conn:
        # Three long misspelt words and a short one: the candidates of the first two fit
        # one statement's bound, the third's do not (it is searched as written), the short
        # word's still do.
        typos = ["internationalisatoins", "counterrevolutionareis", "electroencephalogrpahs",
                 "recieve"]
        sizes = [len(one_edit(w)) for w in typos]
        assert sizes[0] + sizes[1] <= MAX_CANDIDATES < sizes[0] + sizes[1] + sizes[2]
        assert sizes[0] + sizes[1] + sizes[3] <= MAX_CANDIDATES
        assert await corrections(conn, typos, scope="default") == {
            "internationalisatoins": "internationalisations",
            "counterrevolutionareis": "counterrevolutionaries", "recieve": "receive"}
        # `café` is in no document, but its folded form `cafe`, which the query searches
        # anyway, is: found, and nothing said of a correction.
        hits = await search(conn, "café", scope="default", k=3)
        assert [h.path for h in hits][:1] == ["notes/cafe.md"] and hits.corrected == {}



def test_any_query_is_searched_and_only_its_own_words_are_corrected(database_url):
    """Every character, every size: a search answers, and what it says it corrected are
    words of the query, each searched as a word near it."""

    async def connected(work):
        async with await psycopg.AsyncConnection.connect(database_url,
                                                         autocommit=True) as conn:
            return await work(conn)

    asyncio.run(connected(lambda conn: index_documents(
        conn, [IndexDoc(path=p, kind="daily", body=b) for p, b in SAID.items()],
        scope="default")))

    async def one(conn, query):
        hits = await search(conn, query, scope="default", k=3)
        words = await query_lexemes(conn, query, "default")
        for old, new in hits.corrected.items():
            # One edit away, or the word memory holds that such a word finds by its light
            # stem's prefix.
            near = one_edit(old)
            assert old in words and (new in near or any(
                new.startswith(stem_prefix(c) or c) for c in near)), (query, old, new)

    # Typos of the notes' words (every 17th of their candidates) among any text.
    typos = [c for w in ("receive", "shipment", "deployment", "nicholas", "rotterdam",
                         "бюджет", "clinic", "decisions") for c in one_edit(w)[::17]]

    @settings(max_examples=60, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.text(max_size=300)
           | st.lists(st.sampled_from(typos) | st.text(max_size=12), max_size=6).map(
               " ".join))
    def check(query):
        asyncio.run(connected(lambda conn: one(conn, query)))

    check()
