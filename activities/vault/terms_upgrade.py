"""Documents indexed with an older version of the extra search words (schemas.vault.terms)
indexed again, a batch at a time, on the vault worker's beat.

Invariants:
- Only the search columns change (`tsv`, `doc_len`, `terms_version`): a document's text,
  hash, chunks and links are not touched, and BM25's statistics follow by their triggers,
  as on any write.
- A document written meanwhile is left as its writer left it (the update checks the hash
  it read), and it was written at the current version anyway. Batches commit one by one:
  a worker killed half way leaves the rest for its successor's next beat.
- Cost: the partial index of the documents still due (`memory_docs_terms_due_3`, its
  predicate the version's: migration 013 made it for version 3) lists them, so a beat
  with nothing due costs one index probe per scope.
"""

from __future__ import annotations

from psycopg import AsyncConnection

from activities.vault.search import MAX_INDEXED_CHARS, doc_language
from schemas.vault.terms import TERMS_VERSION, extra_terms

__all__ = ["TERMS_BATCH", "upgrade_terms"]

# Documents a batch: one statement each way, a few MB at most (bodies are long memory's
# documents, a few KB each, and the extra words are bounded).
TERMS_BATCH = 200

# The version is written into the statement, not sent as a parameter: a plan made for any
# parameter (psycopg prepares a statement run often) could not use the partial index.
_DUE = ("SELECT path, title, tags, left(body, %s), content_hash FROM memory_docs"
        f" WHERE scope = %s AND terms_version < {TERMS_VERSION} ORDER BY path LIMIT %s")

# The hash is checked by the UPDATE itself, so a document written since it was read (the
# row's newest version, re-checked under its lock) is left alone.
_UPDATE = """
WITH r AS (
    SELECT * FROM unnest(%(path)s::text[], %(hash)s::text[], %(x_title)s::text[],
                         %(x_tags)s::text[], %(x_body)s::text[], %(lang)s::text[])
        AS r(path, hash, x_title, x_tags, x_body, lang)
), v AS (
    SELECT m.path, r.hash, r.lang,
           memory_doc_tsv(m.title, m.tags, m.body, %(max_chars)s, r.x_title, r.x_tags,
                          r.x_body, r.lang::regconfig) AS tsv
    FROM r JOIN memory_docs m ON m.scope = %(scope)s AND m.path = r.path
)
UPDATE memory_docs d
SET tsv = v.tsv,
    doc_len = (SELECT coalesce(sum(cardinality(u.positions)), 0) FROM unnest(v.tsv) u),
    terms_version = %(version)s, stem_language = v.lang
FROM v
WHERE d.scope = %(scope)s AND d.path = v.path AND d.content_hash = v.hash
"""


async def upgrade_terms(conn: AsyncConnection, *, scope: str,
                        limit: int = TERMS_BATCH) -> int:
    """Index again up to `limit` of the scope's documents whose extra words are of an
    older version; returns how many were due (fewer than `limit`: none is left)."""
    async with conn.transaction():
        rows = await (await conn.execute(
            _DUE, (MAX_INDEXED_CHARS, scope, limit))).fetchall()
        if rows:
            await conn.execute(_UPDATE, {
                "path": [r[0] for r in rows], "hash": [r[4] for r in rows],
                "x_title": [extra_terms(r[1]) for r in rows],
                "x_tags": [extra_terms(r[2]) for r in rows],
                "x_body": [extra_terms(r[3]) for r in rows],
                "lang": [doc_language(r[1], r[3]) for r in rows],
                "version": TERMS_VERSION, "max_chars": MAX_INDEXED_CHARS, "scope": scope})
    return len(rows)
