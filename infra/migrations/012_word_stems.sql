-- Long memory's English words are also found by their stems: `buying` finds `buy` and
-- `buys`, `meetings` finds `meeting`, `happily` finds `happy`. The stems are Snowball's, as
-- PostgreSQL's built-in `english` configuration makes them (every server has it), indexed
-- beside the `simple` parser's own words like migration 011's extra words: weighted as
-- their column, minus the words the parser found itself (a word that is its own stem is
-- not counted twice), stop words left out. A query is looked up by its words' stems too
-- (activities.vault.search), so the two sides meet on the stem. Words of other languages
-- pass through the English stemmer mostly unchanged, and an unchanged word adds nothing.
--
-- Documents indexed before this are indexed again by the vault worker's beat, as after
-- migration 011 (`terms_version` 2, schemas.vault.terms.TERMS_VERSION); the partial index
-- of the documents due follows the version.
DROP INDEX IF EXISTS memory_docs_terms_due;
CREATE INDEX IF NOT EXISTS memory_docs_terms_due_2 ON memory_docs (scope, path)
    WHERE terms_version < 2;

CREATE OR REPLACE FUNCTION memory_doc_tsv(title text, tags text, body text, max_chars int,
                                          x_title text, x_tags text, x_body text)
RETURNS tsvector LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    own tsvector := setweight(to_tsvector('simple', title), 'A')
                    || setweight(to_tsvector('simple', tags), 'B')
                    || setweight(to_tsvector('simple', left(body, max_chars)), 'D');
    extra tsvector := setweight(to_tsvector('english', title), 'A')
                      || setweight(to_tsvector('english', tags), 'B')
                      || setweight(to_tsvector('english', left(body, max_chars)), 'D');
BEGIN
    IF x_title <> '' OR x_tags <> '' OR x_body <> '' THEN
        extra := extra || setweight(to_tsvector('simple', x_title), 'A')
                       || setweight(to_tsvector('simple', x_tags), 'B')
                       || setweight(to_tsvector('simple', x_body), 'D');
    END IF;
    RETURN own || ts_delete(extra, tsvector_to_array(own));
END
$$;
