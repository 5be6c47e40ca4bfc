"""What was said is found (schemas.vault.terms on the real PostgreSQL): text in scripts
written without spaces, compound tokens, accents, emoji, English words by their stems, by
BM25 alone; and a vault indexed before the extra words (migrations 011 and 012) indexed
again on the vault worker's beat, its statistics exact."""

import psycopg
import pytest

from activities.db import apply_migrations
from activities.vault.bm25 import MAX_QUERY_WORDS, query_lexemes
from activities.vault.search import (
    IndexDoc,
    index_documents,
    load_embedder,
    rebuild_statistics,
    search,
)
from activities.vault.terms_upgrade import upgrade_terms
from activities.vault.turn import catch_up_hand_edits
from tests.vault.support import load_corpus, vault_ctx

SAID = {
    "notes/zh.md": "我们决定把数据库迁移到新的服务器上，周五之前完成。",
    "notes/ja.md": "来週の会議で新しいデプロイ手順を説明します。",
    "notes/th.md": "เราจะย้ายฐานข้อมูลไปยังเซิร์ฟเวอร์ใหม่",
    "notes/ko.md": "다음 주에 데이터베이스를 새 서버로 옮깁니다.",
    "notes/code.md": "The bug is in parse_config_file in src/keel/loader.py, see "
                     "KeelLoader.readAll().",
    "notes/ver.md": "Upgrade to v2.14.3 on host 10.0.4.17 fixed it; ticket JIRA-4821.",
    "notes/mail.md": "Send the invoice to anna.petrova@example.com by Monday.",
    "notes/accents.md": "Le café près de la gare ferme à midi. Ёлка стоит в зале.",
    "notes/emoji.md": "Deploy went 🚀 smoothly, but the alarm fired at 3am.",
    "notes/joined.md": "O'Brien wants a follow-up on the e-mail budget of $12,500.",
    "notes/filler.md": "Lunch options near the office include sushi and pizza.",
    "notes/stems.md": "Maria was buying groceries for the weekly meetings, happily.",
}
FOUND_BY = [
    ("数据库", "notes/zh.md"), ("数据库迁移", "notes/zh.md"), ("服务器", "notes/zh.md"),
    ("デプロイ", "notes/ja.md"), ("会議", "notes/ja.md"), ("ฐานข้อมูล", "notes/th.md"),
    ("데이터베이스", "notes/ko.md"),
    ("loader.py", "notes/code.md"), ("readAll", "notes/code.md"),
    ("KeelLoader", "notes/code.md"), ("loader", "notes/code.md"),
    ("2.14.3", "notes/ver.md"), ("v2.14.3", "notes/ver.md"), ("4821", "notes/ver.md"),
    ("JIRA-4821", "notes/ver.md"), ("10.0.4.17", "notes/ver.md"),
    ("anna.petrova@example.com", "notes/mail.md"), ("example.com", "notes/mail.md"),
    ("cafe pres de la gare", "notes/accents.md"), ("елка", "notes/accents.md"),
    ("🚀", "notes/emoji.md"),
    ("obrien", "notes/joined.md"), ("followup email", "notes/joined.md"),
    ("12500", "notes/joined.md"),
    # English words by their stems (migration 012): forms the text never wrote.
    ("buy groceries", "notes/stems.md"), ("buys", "notes/stems.md"),
    ("meeting", "notes/stems.md"), ("grocery", "notes/stems.md"), ("happy", "notes/stems.md"),
]

# The search index as Keel wrote it before migration 011: the parser's words alone.
_OLD_TSV = """
UPDATE memory_docs SET tsv = v.tsv, terms_version = 0,
    doc_len = (SELECT coalesce(sum(cardinality(u.positions)), 0) FROM unnest(v.tsv) u)
FROM (SELECT path, setweight(to_tsvector('simple', title), 'A')
             || setweight(to_tsvector('simple', tags), 'B')
             || setweight(to_tsvector('simple', left(body, 100000)), 'D') AS tsv
      FROM memory_docs) v
WHERE memory_docs.path = v.path
"""


@pytest.fixture
def ctx(tmp_path, database_url):
    return vault_ctx(tmp_path, database_url)


async def _first(conn, query):
    return [h.path for h in await search(conn, query, scope="default", k=3)]


async def test_what_was_said_is_found_by_the_words_a_person_searches_with(ctx):
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await index_documents(conn, [IndexDoc(path=p, kind="daily", body=b)
                                     for p, b in SAID.items()], scope="default")
        for query, path in FOUND_BY:
            assert (await _first(conn, query))[:1] == [path], query
        # Nothing is found by a word it does not hold.
        assert await _first(conn, "服务") != ["notes/ja.md"]
        assert await _first(conn, "4822") == []


async def _df(conn) -> dict[str, int]:
    rows = await (await conn.execute(
        "SELECT term, df FROM memory_terms WHERE scope = 'default' AND df > 0")).fetchall()
    return dict(rows)


async def test_a_vault_indexed_before_the_extra_words_is_indexed_again_on_the_beat(
        ctx, database_url):
    """Migration 011 on a database whose vault was indexed by the parser alone: every
    document is due, the beat indexes it again (the documents' text, hash and statistics
    exact), and what was said is found; the corpus ranks as before."""
    queries = await load_corpus(ctx)
    for path, body in SAID.items():
        target = ctx.vault.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"# {path}\n\n{body}\n", encoding="utf-8")
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await ctx.vault.reindex(conn)
        current = {r[0]: r[1:] for r in await (await conn.execute(
            "SELECT path, tsv::text, doc_len, content_hash FROM memory_docs")).fetchall()}
        ranked_now = [await _first(conn, q["query"]) for q in queries]
    with psycopg.connect(database_url, autocommit=True) as conn:  # as before migration 011
        conn.execute(_OLD_TSV)
        conn.execute("DROP INDEX memory_docs_terms_due_3")
        conn.execute("ALTER TABLE memory_docs DROP COLUMN terms_version,"
                     " DROP COLUMN stem_language")
        conn.execute("DROP TABLE memory_languages")
        conn.execute("DROP TRIGGER memory_docs_languages_ins ON memory_docs")
        conn.execute("DROP TRIGGER memory_docs_languages_upd ON memory_docs")
        conn.execute("DROP FUNCTION memory_docs_languages")
        conn.execute("DROP FUNCTION memory_doc_tsv(text, text, text, int, text, text, text)")
        conn.execute("DROP FUNCTION memory_doc_tsv(text, text, text, int, text, text, text,"
                     " regconfig)")
        conn.execute("DELETE FROM schema_migrations WHERE name IN ('011_search_terms.sql',"
                     " '012_word_stems.sql', '013_stem_languages.sql')")
    assert apply_migrations(database_url) == ["011_search_terms.sql", "012_word_stems.sql",
                                              "013_stem_languages.sql"]
    async with pool.connection() as conn:
        due = (await (await conn.execute(
            "SELECT count(*) FROM memory_docs WHERE terms_version = 0")).fetchone())[0]
        assert due == len(current) > 10
        assert await _first(conn, "数据库") == []
        assert await upgrade_terms(conn, scope="default", limit=3) == 3  # one batch
    await catch_up_hand_edits(ctx)  # the beat does the rest
    async with pool.connection() as conn:
        after = {r[0]: r[1:] for r in await (await conn.execute(
            "SELECT path, tsv::text, doc_len, content_hash FROM memory_docs")).fetchall()}
        assert after == current
        assert await upgrade_terms(conn, scope="default") == 0
        for query, path in FOUND_BY[:3]:
            assert (await _first(conn, query))[:1] == [f"notes/{path.split('/')[1]}"]
        assert [await _first(conn, q["query"]) for q in queries] == ranked_now
        kept = await _df(conn)
        await rebuild_statistics(conn, scope="default")
        assert await _df(conn) == kept


async def test_a_long_message_is_searched_by_its_rarest_words_memory_holds(ctx):
    """A recall query is a whole message: its first words in the order written are looked
    up, and the rarest of them that memory holds choose the documents (not the first 32
    in alphabetical order, which left out every word after `m` in a long message)."""
    common = [f"word{i}" for i in range(40)]
    docs = [IndexDoc(path=f"notes/common{i}.md", kind="daily",
                     body=" ".join(common[i % 40:] + common[:i % 40])) for i in range(20)]
    docs.append(IndexDoc(path="notes/zeppelin.md", kind="daily",
                         body="The zeppelin exhibit opens in March, word1 word2."))
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await index_documents(conn, docs, scope="default")
        message = " ".join(common) + " zeppelin"  # 41 words, the rare one last of all
        assert (await _first(conn, message))[:1] == ["notes/zeppelin.md"]
        # Past the words looked up, a word is not searched.
        tail = " ".join(f"filler{i}" for i in range(MAX_QUERY_WORDS + 6)) + " zeppelin"
        assert "notes/zeppelin.md" not in await _first(conn, tail)


@pytest.mark.parametrize("dense", [False, True])
async def test_a_session_searches_its_own_entries_that_checkpoints_moved_out(ctx, dense):
    """memory_search leaves out the session's own transcript entries from its live window
    on (they are in its context), not those checkpoints moved out of it; another session's
    are searched whole. Without a window start, all of the session's are left out. BM25,
    and the dense ranking alone."""
    embedder = load_embedder("hashing") if dense else None
    said = [("s1", 2, "the launch code word is pelican"),
            ("s1", 10, "the launch code word is heron"),
            ("s1", 20, "the launch code word is osprey"),
            ("s2", 5, "the launch code word is albatross")]
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await index_documents(conn, [IndexDoc(
            path=f"daily/2026-12-05.md#{sid}:{seq}", kind="daily", body=text, session_id=sid,
            seq=seq) for sid, seq, text in said], scope="default", embedder=embedder)

        async def found(live_from):
            hits = await search(conn, "launch code word", scope="default", k=10,
                                exclude_session="s1", live_from_seq=live_from,
                                embedder=embedder, use_lexical=not dense)
            return sorted(h.path.split("#")[1] for h in hits)

        assert await found(10) == ["s1:2", "s2:5"]
        assert await found(21) == ["s1:10", "s1:2", "s1:20", "s2:5"]
        assert await found(None) == ["s2:5"]


async def test_the_documents_due_are_found_by_the_partial_index_of_the_version(ctx):
    """The due documents' statement and the migration's partial index name the same
    version: a TERMS_VERSION bump without a new index would walk every document."""
    from activities.vault.terms_upgrade import _DUE
    from schemas.vault.terms import TERMS_VERSION

    pool = await ctx.pool()
    async with pool.connection() as conn:
        await conn.execute("SET enable_seqscan = off")
        for generic in ("force_custom_plan", "force_generic_plan"):
            await conn.execute(f"SET plan_cache_mode = {generic}")
            plan = "\n".join(r[0] for r in await (await conn.execute(
                "EXPLAIN " + _DUE, (100_000, "default", 10))).fetchall())
            assert f"memory_docs_terms_due_{TERMS_VERSION}" in plan, plan


async def test_a_folded_form_is_searched_only_for_a_word_memory_does_not_hold_as_written(ctx):
    """`café` finds a note that wrote `cafe` when no note holds `café`; where one does, its
    fold is not searched: in Vietnamese `có` (has) and `cô` (she) fold alike."""
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await index_documents(conn, [
            IndexDoc(path="notes/she.md", kind="note", body="Cô ấy đến muộn."),
            IndexDoc(path="notes/has.md", kind="note", body="Tôi có một ý tưởng."),
            IndexDoc(path="notes/plain.md", kind="note", body="Meet at the cafe."),
        ], scope="folds")

        async def found(query):
            return sorted(h.path for h in await search(conn, query, scope="folds", k=3,
                                                       spelling=False))

        assert await found("cô") == ["notes/she.md"]
        assert await found("có") == ["notes/has.md"]
        assert await found("co") == ["notes/has.md", "notes/she.md"]  # typed without marks
        assert await found("café") == ["notes/plain.md"]  # no note holds `café`
        await index_documents(conn, [IndexDoc(path="notes/accent.md", kind="note",
                                              body="Le café ferme à midi.")], scope="folds")
        assert await found("café") == ["notes/accent.md"]
        assert await found("cafe") == ["notes/accent.md", "notes/plain.md"]


async def test_a_possessive_in_a_query_finds_the_name_not_other_possessives(ctx):
    # To the parser "Northwind's" is "northwind" and "s", and "s" is rarer than the name:
    # an entry saying "Keel's" (the offline model's echo) ranked above the person's own.
    said = {"daily/said.md#s:1": "remember that Dana works at Northwind",
            "daily/said.md#s:2": "Keel's model heard you: Dana works at Northwind",
            "daily/said.md#s:3": "it's Keel's turn to check the queue"}
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await index_documents(conn, [IndexDoc(path=p, kind="daily", body=b)
                                     for p, b in said.items()], scope="default")
        assert await query_lexemes(conn, "Northwind's employer", "default") == [
            "northwind", "employer", "employ"]
        found = [h.path for h in await search(conn, "Northwind's", scope="default", k=3)]
    assert found[0] == "daily/said.md#s:1" and "daily/said.md#s:3" not in found
