"""Okapi BM25 in PostgreSQL's own full-text index: a query's words, and the documents they
rank.

Invariants:
- A query is looked up by the words a document is indexed by (migrations 011 to 013's
  `memory_doc_tsv`): the `simple` parser's, each with its stems where they differ (in its
  own language; in English and the other languages its scope holds when its own cannot be
  told), then its extra words (schemas.vault.terms); `words_of` says which of them the
  query wrote. A written word's folded form (`cafe` of `café`) is looked up only when the
  word as written is held by no document.
- Candidates come from the GIN index by the query's informative words only (its commonest
  words score them but do not choose them); BM25 scores them with the document-frequency
  table (`memory_terms`) the triggers keep exact, the column weights applied, a long word
  also matching its variants by its light stem (schemas.vault.search).
- Every statement filters by the scope it is given; the pool of candidates follows the hits
  asked for, not the scope's size.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import AsyncConnection

from schemas.vault.language import told_language
from schemas.vault.search import (
    BM25_B,
    BM25_K1,
    COLUMN_WEIGHTS,
    Candidate,
    candidate_pool,
    term_patterns,
    term_range,
)
from schemas.vault.terms import extra_terms, folded_from, without_possessive_s

__all__ = ["LEXEMES", "MAX_QUERY_TERMS", "MAX_QUERY_WORDS", "bm25", "bm25_candidates",
           "clean_text", "lexeme_params", "query_lexemes", "query_words", "words_of"]

# A query's words looked up in the index: its first, in the order written (a long message
# as a recall query), a word's stem beside it where that differs (for about one word in
# four of REALTALK's messages: 96 looks up some 75 written words); of them, the
# MAX_QUERY_TERMS rarest that memory holds choose and score the candidates (the others
# only lower every document's coverage alike).
MAX_QUERY_WORDS = 96
MAX_QUERY_TERMS = 32
QUERY_EXTRA_CHARS = 8_000
# A term in more than this share of all documents (and in more than a pool's worth) does
# not choose candidates, it only scores them: at 5% a query at 10,000 documents spent most
# of its time ranking the documents of its commonest words.
COMMON_TERM_SHARE = 0.01


def clean_text(text: str) -> str:
    """Text as PostgreSQL takes it: it cannot hold NUL, and lone surrogates (from
    undecodable bytes) cannot be sent either."""
    return text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


# The term frequency of a query term in a document, column weights applied, is what
# ts_rank_cd gives for that term alone with no normalisation: every occurrence is a cover
# of its own and adds its weight. The weights are COLUMN_WEIGHTS / 4 in {D, C, B, A} order
# (ts_rank_cd takes weights up to 1; quarters are exact in binary, so 4x the rank is the
# weighted count exactly). One call per (candidate, term) in C, where unnesting every
# candidate's tsvector to match its lexemes cost half the statement.
_TF_SCALE = 4
_TF_WEIGHTS = "{" + ",".join(str(COLUMN_WEIGHTS[w] / _TF_SCALE) for w in "DCBA") + "}"

_BM25 = f"""
WITH qt AS (
    SELECT t.i, t.pattern, t.tsq, t.tsq::tsquery AS term, t.lo, t.hi, t.fold
    FROM unnest(%(patterns)s::text[], %(tsqs)s::text[], %(los)s::text[], %(his)s::text[],
                %(folds)s::int[])
         WITH ORDINALITY AS t(pattern, tsq, lo, hi, fold, i)
),
stats AS (
    SELECT greatest(n_docs, 1)::float8 AS n,
           greatest(total_len::float8 / greatest(n_docs, 1), 1) AS avgdl
    FROM (SELECT coalesce((SELECT n_docs FROM memory_stats WHERE scope = %(scope)s), 0)
                 AS n_docs,
                 coalesce((SELECT total_len FROM memory_stats WHERE scope = %(scope)s), 0)
                 AS total_len) ms
),
qidf AS (
    SELECT qt.i, qt.fold, qt.tsq, qt.term, d.df, ln(1 + (s.n - d.df + 0.5) / (d.df + 0.5))
           AS idf
    FROM qt, stats s,
         LATERAL (SELECT least(coalesce(sum(m.df), 0), s.n) AS df
                  FROM memory_terms m
                  -- The range lets the (scope, term text_pattern_ops) index find the
                  -- prefix: a LIKE on a pattern from a row cannot.
                  WHERE m.scope = %(scope)s AND m.term ~>=~ qt.lo AND m.term ~<~ qt.hi
                    AND m.term LIKE qt.pattern) d
),
-- A word's folded form (schemas.vault.terms.folded_from) only when the word as written is
-- held by no document.
usable AS (
    SELECT q.* FROM qidf q
    WHERE NOT EXISTS (SELECT 1 FROM qidf w WHERE w.i = q.fold AND w.df > 0)
),
chosen AS (
    SELECT * FROM usable WHERE df > 0 ORDER BY idf DESC, i LIMIT {MAX_QUERY_TERMS}
),
-- Candidates come from the informative terms: a word in most documents would fill the
-- pool with documents that only share it (ts_rank knows no IDF). Common words still
-- count in the score below.
informative AS (
    SELECT q.* FROM chosen q, stats s
    WHERE q.df <= greatest(%(pool)s, s.n * {COMMON_TERM_SHARE})
       OR NOT EXISTS (SELECT 1 FROM chosen q2
                      WHERE q2.df <= greatest(%(pool)s, s.n * {COMMON_TERM_SHARE}))
),
cand AS (
    SELECT DISTINCT ON (c.path) c.path, c.tsv, c.doc_len, c.card_key, c.penalised
    FROM informative q
    CROSS JOIN LATERAL (
        SELECT d.path, d.tsv, d.doc_len, d.card_key, d.penalised
        FROM memory_docs d
        WHERE d.scope = %(scope)s AND d.tsv @@ to_tsquery('simple', q.tsq)
          AND (%(kinds)s::text[] IS NULL OR d.kind = ANY(%(kinds)s::text[]))
          AND (%(exclude_session)s::text IS NULL
               OR d.session_id IS DISTINCT FROM %(exclude_session)s::text
               OR d.seq < %(live_from)s::bigint)
        ORDER BY d.doc_len, d.path
        LIMIT %(pool)s
    ) c
),
-- Each candidate's vector read once: a stored one is compressed (or out of line), and every
-- match and rank below would decompress it again (a long Thai note: 27 us a term against 5).
held AS MATERIALIZED (
    SELECT c.path, c.tsv || ''::tsvector AS tsv, c.doc_len, c.card_key, c.penalised
    FROM cand c
),
scored AS (
    SELECT c.path, c.card_key, c.penalised,
           sum(q.idf * t.tf * ({BM25_K1} + 1)
               / (t.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * c.doc_len / s.avgdl)))
               AS bm25,
           sum(q.idf) AS matched_idf
    FROM held c CROSS JOIN chosen q CROSS JOIN stats s
    CROSS JOIN LATERAL (
        SELECT {_TF_SCALE} * ts_rank_cd('{_TF_WEIGHTS}', c.tsv, q.term, 0)::float8 AS tf) t
    WHERE c.tsv @@ q.term
    GROUP BY c.path, c.card_key, c.penalised
)
SELECT sc.path, sc.card_key, sc.penalised, sc.bm25,
       sc.matched_idf / nullif((SELECT sum(idf) FROM usable), 0) AS coverage,
       CASE WHEN sc.card_key IS NULL THEN 0
            ELSE (SELECT count(*) FROM memory_links l
                  WHERE l.scope = %(scope)s AND l.dst = sc.card_key) END AS incoming
FROM scored sc
ORDER BY sc.bm25 DESC, sc.path
"""


# A query's words as a document's (migration 013's `memory_doc_tsv`): the parser's, each
# followed by its stems where they differ, in the order written, then the extra ones
# (schemas.vault.terms); and whether the parser found the word itself (only such a word
# is one the query wrote, and spelling corrects only those). The stems are those of the
# language the query is written in (schemas.vault.language); when that cannot be told,
# English's and those of every other language the scope holds documents in
# (`memory_languages`): a query too short to tell meets a document on the stem it was
# indexed by.
LEXEMES = """
SELECT lexeme, bool_or(own) FROM (
    SELECT lexeme, positions[1] AS at, true AS own FROM unnest(to_tsvector('simple', %(q)s))
    UNION ALL
    SELECT v.lexeme, v.positions[1], false
    FROM (SELECT coalesce(%(told)s::text, 'english')::regconfig AS cfg
          UNION ALL
          SELECT l.language::regconfig FROM memory_languages l
          WHERE %(told)s::text IS NULL AND l.scope = %(scope)s
            AND l.language <> 'english') c,
         unnest(to_tsvector(c.cfg, %(q)s)) v
    UNION ALL
    SELECT lexeme, 1000000 + positions[1], false FROM unnest(to_tsvector('simple', %(x)s))
) w
GROUP BY lexeme ORDER BY min(at), bool_or(own) DESC, lexeme
"""


def lexeme_params(query: str, scope: str) -> dict[str, str | None]:
    # The extra words of the query's beginning only: past MAX_QUERY_WORDS words none of a
    # query's words is looked up anyway (a tool's query of a megabyte costs no more).
    text = without_possessive_s(clean_text(query))
    return {"q": text, "x": extra_terms(text[:QUERY_EXTRA_CHARS]), "scope": scope,
            "told": told_language(text)}


def words_of(rows: Sequence[tuple[str, bool]]) -> tuple[list[str], list[str]]:
    """The query's words looked up, and of them those the query wrote."""
    rows = rows[:MAX_QUERY_WORDS]
    return [w for w, _ in rows], [w for w, own in rows if own]


async def query_lexemes(conn: AsyncConnection, query: str, scope: str) -> list[str]:
    return (await query_words(conn, query, scope))[0]


async def query_words(conn: AsyncConnection, query: str,
                      scope: str) -> tuple[list[str], list[str]]:
    cur = await conn.execute(LEXEMES, lexeme_params(query, scope))
    return words_of(await cur.fetchall())


async def bm25_candidates(conn: AsyncConnection, query: str, *, scope: str,
                          kinds: list[str] | None = None,
                          exclude_session: str | None = None, pool: int | None = None,
                          live_from_seq: int | None = None) -> list[Candidate]:
    lexemes, written = await query_words(conn, query, scope)
    return await bm25(conn, lexemes, scope=scope, kinds=kinds, written=written,
                       exclude_session=exclude_session, live_from_seq=live_from_seq,
                       pool=pool or candidate_pool(10))


async def bm25(conn: AsyncConnection, lexemes: list[str], *, scope: str,
                kinds: list[str] | None, exclude_session: str | None, pool: int,
                live_from_seq: int | None = None,
                written: Sequence[str] = ()) -> list[Candidate]:
    """`written`: the lexemes the query wrote itself (words_of), whose folded forms are
    looked up only when they are held by no document."""
    terms = term_patterns(lexemes)
    if not terms:
        return []
    ranges = [term_range(lex) for lex, _, _ in terms]
    cur = await conn.execute(_BM25, {
        "folds": folded_from([lex for lex, _, _ in terms], written),
        "patterns": [p for _, p, _ in terms],
        "tsqs": [q for _, _, q in terms],
        "los": [lo for lo, _ in ranges], "his": [hi for _, hi in ranges],
        "kinds": kinds, "exclude_session": exclude_session, "live_from": live_from_seq,
        "pool": pool, "scope": scope,
    })
    return [Candidate(path=path, card_key=key, penalised=pen,
                                      bm25=float(bm25), coverage=float(cov or 0.0),
                                      incoming=int(inc))
            for path, key, pen, bm25, cov, inc in await cur.fetchall()]
