"""A searched word memory lacks, corrected to the word memory holds one edit away.

The rule is `schemas.vault.spelling`'s (which words, which candidates, which one wins);
this reads what it needs from one scope's term statistics (`memory_terms`).

Invariants:
- A word counts as held exactly when BM25 would score it: looked up as `_bm25` looks it up
  (a long word by its light stem's prefix, `term_patterns` / `term_range`), with a
  document frequency above 0 in the scope. A held word is never corrected.
- Reads only `memory_terms` of the scope asked, by its primary key's range: one statement
  when every word tried is held, two when some is not (the candidates of all of them in
  one, at most `MAX_CANDIDATES`), none when no word of the query is one `correctable`
  takes. So a search's cost stays bounded whatever its query.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import AsyncConnection

from schemas.vault.search import term_patterns, term_range
from schemas.vault.spelling import MAX_CORRECTED, best_correction, correctable, one_edit

__all__ = ["MAX_CANDIDATES", "corrections"]

# The candidates one statement looks up at most (about six words of nine letters; ~1 ms
# each hundred at 100,000 documents): a query of many long misspelt words corrects its
# first ones.
MAX_CANDIDATES = 3_000

# For each word: the documents holding it as a word of its own, and those holding any
# word BM25 finds it by.
_HELD = """
SELECT c.i, d.df, d.exact
FROM unnest(%(words)s::text[], %(pats)s::text[], %(los)s::text[], %(his)s::text[])
     WITH ORDINALITY AS c(word, pat, lo, hi, i)
CROSS JOIN LATERAL (
    SELECT sum(m.df) AS df, coalesce(sum(m.df) FILTER (WHERE m.term = c.word), 0) AS exact
    FROM memory_terms m
    WHERE m.scope = %(scope)s AND m.term ~>=~ c.lo AND m.term ~<~ c.hi AND m.term LIKE c.pat
) d
WHERE d.df > 0
"""


async def _held(conn: AsyncConnection, words: Sequence[str], *, scope: str
                ) -> dict[str, tuple[int, int]]:
    """word -> (documents holding it exactly, documents BM25 finds it in), for the words
    memory holds."""
    if not words:
        return {}
    terms = term_patterns(list(words))
    ranges = [term_range(lex) for lex, _, _ in terms]
    cur = await conn.execute(_HELD, {
        "words": [lex for lex, _, _ in terms], "pats": [p for _, p, _ in terms],
        "los": [lo for lo, _ in ranges], "his": [hi for _, hi in ranges], "scope": scope})
    return {terms[i - 1][0]: (int(exact), int(df)) for i, df, exact in await cur.fetchall()}


async def corrections(conn: AsyncConnection, lexemes: Sequence[str], *, scope: str
                      ) -> dict[str, str]:
    """For each of the query's first `MAX_CORRECTED` correctable words that memory lacks,
    the word one edit away to search instead (those with none are left out)."""
    tried = [w for w in dict.fromkeys(lexemes) if correctable(w)][:MAX_CORRECTED]
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
    known = await _held(conn, sorted({c for cs in candidates.values() for c in cs}),
                        scope=scope)
    out: dict[str, str] = {}
    for word, edits in candidates.items():
        best = best_correction(word, {c: known[c] for c in edits if c in known})
        # A word the query already searches (an accent's folded form) says nothing new.
        if best is not None and best not in lexemes:
            out[word] = best
    return out
