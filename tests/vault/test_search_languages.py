"""What was said in another language is found by its words' other forms
(schemas.vault.language and migration 013 on the real PostgreSQL): a document is stemmed in
its own language, a query in its own when that can be told and else in English and every
language its scope holds, so `hablo` finds `hablé`, `книгу` finds `книги`, `Haus` finds
`Häuser`; English vaults are as before, and a scope's languages are its own."""

import pytest

from activities.vault.bm25 import query_lexemes
from activities.vault.search import IndexDoc, index_documents, search
from activities.vault.terms_upgrade import upgrade_terms
from tests.vault.support import vault_ctx

SAID = {
    "notes/es.md": "Ayer hablé con el director y comimos juntos en la plaza.",
    "notes/de.md": "Die Kinder spielen im Garten, und die Häuser sind sehr alt.",
    "notes/ru.md": "Я купила две книги и пошла из дома пешком.",
    "notes/ar.md": "قرأت الكتاب في المدرسة أمس مع أصدقائي.",
    "notes/tr.md": "Bu evler ve kitaplar çok eski, ama hâlâ güzel.",
    "notes/fr.md": "Les chevaux sont dans le pré avec le fermier depuis midi.",
    "notes/it.md": "Ho comprato i libri per la scuola e per il corso di storia.",
    "notes/el.md": "Τα βιβλία είναι στο τραπέζι και τα παιδιά διαβάζουν.",
    "notes/en.md": "Maria was buying groceries for the weekly meetings, happily.",
}
LANGUAGE = {"es": "spanish", "de": "german", "ru": "russian", "ar": "arabic",
            "tr": "turkish", "fr": "french", "it": "italian", "el": "greek", "en": "english"}
# Forms the notes never wrote, whose light stem (a long word's prefix) does not reach them.
FOUND_BY = [("hablo", "es"), ("comer", "es"), ("Haus", "de"), ("Kind", "de"),
            ("книгу", "ru"), ("домой", "ru"), ("كتاب", "ar"), ("evde", "tr"),
            ("kitabı", "tr"), ("cheval", "fr"), ("libro", "it"), ("βιβλίο", "el"),
            ("buys", "en")]


@pytest.fixture
def ctx(tmp_path, database_url):
    return vault_ctx(tmp_path, database_url)


def _docs(said: dict[str, str]) -> list[IndexDoc]:
    return [IndexDoc(path=p, kind="note", body=b) for p, b in said.items()]


async def _first(conn, query, scope="default"):
    return [h.path for h in await search(conn, query, scope=scope, k=3, spelling=False)]


async def test_a_word_is_found_by_its_other_forms_in_its_own_language(ctx):
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await index_documents(conn, _docs(SAID), scope="default")
        rows = await (await conn.execute(
            "SELECT path, stem_language FROM memory_docs WHERE scope = 'default'")).fetchall()
        assert {p: lang for p, lang in rows} == {
            f"notes/{k}.md": v for k, v in LANGUAGE.items()}
        held = await (await conn.execute(
            "SELECT language FROM memory_languages WHERE scope = 'default'"
            " ORDER BY language")).fetchall()
        assert [r[0] for r in held] == sorted(set(LANGUAGE.values()) - {"english"})
        for query, lang in FOUND_BY:
            assert (await _first(conn, query))[:1] == [f"notes/{lang}.md"], query


async def test_an_english_scope_searches_as_before_and_a_scope_keeps_its_languages(ctx):
    """Stems of a language are looked up only in a scope that holds it: the same query in
    an English scope is its English words alone, and finds no Spanish note of another
    scope's; a document written again in another language moves its stems."""
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await index_documents(conn, _docs({"notes/en.md": SAID["notes/en.md"]}),
                              scope="english")
        await index_documents(conn, _docs({"notes/es.md": SAID["notes/es.md"]}),
                              scope="spanish")
        assert await query_lexemes(conn, "hablo comer", "english") == ["hablo", "comer"]
        assert await query_lexemes(conn, "hablo comer", "spanish") == [
            "hablo", "habl", "comer", "com"]
        assert await _first(conn, "hablo", "english") == []
        assert await _first(conn, "hablo", "spanish") == ["notes/es.md"]
        # A query whose language is clear is stemmed in it alone, whatever the scope holds.
        english = await query_lexemes(conn, "where are the meetings of the team", "spanish")
        assert english == ["where", "are", "the", "meetings", "meet", "of", "team"]
        assert "habl" in await query_lexemes(conn, "hablé con el director", "english")
        # Rewritten in English: stemmed in English; the scope keeps listing Spanish.
        await index_documents(conn, [IndexDoc(path="notes/es.md", kind="note",
                                              body="Yesterday I talked with the director.")],
                              scope="spanish")
        assert await _first(conn, "hablo", "spanish") == []
        assert await _first(conn, "talking", "spanish") == ["notes/es.md"]


async def test_a_vault_stemmed_in_english_is_stemmed_again_in_its_languages_on_the_beat(ctx):
    """Documents indexed before migration 013 (every one stemmed in English, at version 2)
    are indexed again by the terms upgrade: each in its language, the scope's languages
    listed, and the English ones exactly as they were."""
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await index_documents(conn, _docs(SAID), scope="default")
        fresh = {r[0]: r[1:] for r in await (await conn.execute(
            "SELECT path, tsv::text, doc_len, stem_language FROM memory_docs")).fetchall()}
        await conn.execute(
            "UPDATE memory_docs SET tsv = memory_doc_tsv(title, tags, body, 100000, '', '',"
            " '', 'english'), terms_version = 2, stem_language = 'english'")
        await conn.execute("DELETE FROM memory_languages")
        assert await _first(conn, "книгу") == []
        english = fresh["notes/en.md"][0]
        assert await (await conn.execute("SELECT tsv::text FROM memory_docs WHERE path ="
                                         " 'notes/en.md'")).fetchone() == (english,)
        assert await upgrade_terms(conn, scope="default") == len(SAID)
        after = {r[0]: r[1:] for r in await (await conn.execute(
            "SELECT path, tsv::text, doc_len, stem_language FROM memory_docs")).fetchall()}
        assert after == fresh
        assert await _first(conn, "книгу") == ["notes/ru.md"]


async def test_every_language_named_is_a_configuration_of_the_server(ctx):
    """Each stemmer schemas.vault.language names is one of PostgreSQL's own (all of them
    ship with PostgreSQL 12 and later)."""
    from schemas.vault.language import STEM_LANGUAGES

    pool = await ctx.pool()
    async with pool.connection() as conn:
        names = {r[0] for r in await (await conn.execute(
            "SELECT cfgname FROM pg_ts_config")).fetchall()}
    assert set(STEM_LANGUAGES) <= names
