-- Long memory's documents are found by more words than PostgreSQL's `simple` parser
-- gives (schemas.vault.terms): the character pairs of Chinese, Japanese, Thai and the
-- other scripts written without spaces, the parts of compound tokens (paths, methods,
-- tickets, versions), the folded forms of accented words, emoji. Keel computes those
-- extra words for each document (they take Python's Unicode tables) and `memory_doc_tsv`
-- indexes them beside the parser's own, weighted as the column they come from, minus the
-- words the parser already found (so a word is not counted twice).
--
-- `terms_version` says which version of the extra words a document was indexed with:
-- documents indexed before this migration are 0 and are indexed again, in batches, by the
-- vault worker's beat (activities.vault.terms_upgrade); the partial index finds
-- them without reading the others.
ALTER TABLE memory_docs ADD COLUMN IF NOT EXISTS terms_version smallint NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS memory_docs_terms_due ON memory_docs (scope, path)
    WHERE terms_version < 1;

-- PL/pgSQL: a SQL function with a FROM is not inlined and cost twice the parse itself (5,000
-- documents of ~1 KB: 960-1,470 ms against 450-500 for the bare expression, 460-500 here);
-- a document without extra words (most prose) returns at the first test.
CREATE OR REPLACE FUNCTION memory_doc_tsv(title text, tags text, body text, max_chars int,
                                          x_title text, x_tags text, x_body text)
RETURNS tsvector LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    own tsvector := setweight(to_tsvector('simple', title), 'A')
                    || setweight(to_tsvector('simple', tags), 'B')
                    || setweight(to_tsvector('simple', left(body, max_chars)), 'D');
BEGIN
    IF x_title = '' AND x_tags = '' AND x_body = '' THEN
        RETURN own;
    END IF;
    RETURN own || ts_delete(setweight(to_tsvector('simple', x_title), 'A')
                            || setweight(to_tsvector('simple', x_tags), 'B')
                            || setweight(to_tsvector('simple', x_body), 'D'),
                            tsvector_to_array(own));
END
$$;
