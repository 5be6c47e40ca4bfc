"""A searched word memory lacks, corrected to the word memory holds one edit away (or,
when memory holds such a word only by its light stem's prefix, the word found there that is
nearest to what was written).

The rule is `schemas.vault.spelling`'s (which words, which candidates, which one wins);
this reads what it needs from one scope's term statistics (`memory_terms`).

Invariants:
- A word counts as held exactly when BM25 would score it: looked up as `_bm25` looks it up
  (a long word by its light stem's prefix, `term_patterns` / `term_range`), with a
  document frequency above 0 in the scope. A held word is never corrected.
- Reads only `memory_terms` of the scope asked, by its primary key: one statement when
  every word tried is held, two when some is not (the candidates of all of them in one,
  at most `MAX_CANDIDATES`, looked up as words of their own), three when a word has no
  candidate memory holds as a word of its own (its candidates then looked up as BM25
  would, by their stems' prefixes), none when no word of the query is one `correctable`
  takes. So a search's cost stays bounded whatever its query.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import AsyncConnection

from schemas.vault.search import term_patterns, term_range
from schemas.vault.spelling import (
    MAX_CORRECTED,
    best_correction,
    correctable,
    nearest,
    one_edit,
)

__all__ = ["MAX_CANDIDATES", "corrections"]

# The candidates one statement looks up at most (about six words of nine letters; ~1 ms
# each hundred at 100,000 documents): a query of many long misspelt words corrects its
# first ones.
MAX_CANDIDATES = 3_000

# For each word: the documents holding it as a word of its own, those holding any word
# BM25 finds it by, and the commonest 20 of those words.
_HELD = """
SELECT c.i, d.df, d.exact, d.top
FROM unnest(%(words)s::text[], %(pats)s::text[], %(los)s::text[], %(his)s::text[])
     WITH ORDINALITY AS c(word, pat, lo, hi, i)
CROSS JOIN LATERAL (
    SELECT sum(m.df) AS df, coalesce(sum(m.df) FILTER (WHERE m.term = c.word), 0) AS exact,
           (array_agg(m.term ORDER BY m.df DESC, m.term))[1:20] AS top
    FROM memory_terms m
    WHERE m.scope = %(scope)s AND m.term ~>=~ c.lo AND m.term ~<~ c.hi AND m.term LIKE c.pat
) d
WHERE d.df > 0
"""


_EXACTLY = """
SELECT term, df FROM memory_terms
WHERE scope = %(scope)s AND term = ANY(%(words)s::text[]) AND df > 0
"""


async def _held(conn: AsyncConnection, words: Sequence[str], *, scope: str
                ) -> dict[str, tuple[int, int, list[str]]]:
    """word -> (documents holding it exactly, documents BM25 finds it in, the commonest
    words it finds), for the words memory holds."""
    if not words:
        return {}
    terms = term_patterns(list(words))
    ranges = [term_range(lex) for lex, _, _ in terms]
    cur = await conn.execute(_HELD, {
        "words": [lex for lex, _, _ in terms], "pats": [p for _, p, _ in terms],
        "los": [lo for lo, _ in ranges], "his": [hi for _, hi in ranges], "scope": scope})
    return {terms[i - 1][0]: (int(exact), int(df), top)
            for i, df, exact, top in await cur.fetchall()}


async def _exactly(conn: AsyncConnection, words: Sequence[str], *, scope: str
                   ) -> dict[str, int]:
    """word -> the documents holding it as a word of its own, for those memory holds: one
    scan of the primary key for all of them."""
    cur = await conn.execute(_EXACTLY, {"words": list(words), "scope": scope})
    return {term: int(df) for term, df in await cur.fetchall()}


def _choose(candidates: dict[str, list[str]], known: dict[str, tuple[int, int, list[str]]],
            lexemes: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """The corrections `known` decides, and the words it finds none for. A candidate held
    only by its stem's prefix is searched as the word it finds there nearest to what was
    written (`decisons` as `decision`, not as the candidate `decisions` nobody wrote)."""
    out: dict[str, str] = {}
    none: list[str] = []
    for word, edits in candidates.items():
        best = best_correction(word, {c: known[c][:2] for c in edits if c in known})
        if best is None:
            none.append(word)
            continue
        exact, _, held = known[best]
        best = best if exact else nearest(word, held)
        if best not in lexemes:  # one the query already searches (an accent's folded
            out[word] = best     # form) says nothing new
    return out, none


async def corrections(conn: AsyncConnection, lexemes: Sequence[str], *, scope: str,
                      searched: Sequence[str] = ()) -> dict[str, str]:
    """For each of the query's first `MAX_CORRECTED` correctable words that memory lacks
    (`lexemes`: the words the query wrote), the word one edit away to search instead
    (those with none are left out). `searched`: every word the query is looked up by
    beside them (stems, folded forms); a correction among them is not said."""
    tried = [w for w in dict.fromkeys(lexemes) if correctable(w)][:MAX_CORRECTED]
    lexemes = [*lexemes, *searched]
    held = await _held(conn, tried, scope=scope)
    lacking = [w for w in tried if w not in held]
    if not lacking:
        return {}
    candidates: dict[str, list[str]] = {}
    budget = MAX_CANDIDATES
    for word in lacking:  # in the order written, each whose candidates still fit
        edits = one_edit(word)
        if len(edits) <= budget:
            candidates[word], budget = edits, budget - len(edits)
    # Words memory holds as they are first (one index scan); only a word none of whose
    # candidates is one looks them up by their stems' prefixes (a range scan each).
    exact = await _exactly(conn, sorted({c for cs in candidates.values() for c in cs}),
                           scope=scope)
    out, none = _choose(candidates, {c: (df, df, [c]) for c, df in exact.items()}, lexemes)
    if none:
        rest = {w: candidates[w] for w in none}
        known = await _held(conn, sorted({c for cs in rest.values() for c in cs}),
                            scope=scope)
        out.update(_choose(rest, known, lexemes)[0])
    return {w: out[w] for w in candidates if w in out}
