-- Long memory stems a document's words in its own language: a Spanish note's `compré` is
-- found by `compramos`, a Russian one's `книги` by `книгу`, where migration 012 stemmed
-- every document in English (which leaves those words as they are). The language is told
-- by schemas.vault.language (Python) and written beside the document (`stem_language`, a
-- text-search configuration every supported server has); `memory_doc_tsv` takes it.
--
-- A query is looked up by its words' stems in English and in every other language its
-- scope holds documents in (activities.vault.bm25): `memory_languages`, kept by the
-- triggers below. A language stays listed once its scope has held it (a stem nobody
-- holds costs one lookup and matches nothing).
--
-- Documents indexed before this are indexed again by the vault worker's beat
-- (`terms_version` 3); English ones come out as they were.
ALTER TABLE memory_docs ADD COLUMN IF NOT EXISTS stem_language text NOT NULL
    DEFAULT 'english';

CREATE TABLE IF NOT EXISTS memory_languages (
    scope text NOT NULL,
    language text NOT NULL,
    PRIMARY KEY (scope, language)
);

CREATE OR REPLACE FUNCTION memory_docs_languages() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO memory_languages (scope, language)
        SELECT DISTINCT scope, stem_language FROM new_rows WHERE stem_language <> 'english'
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS memory_docs_languages_ins ON memory_docs;
CREATE TRIGGER memory_docs_languages_ins AFTER INSERT ON memory_docs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION memory_docs_languages();
DROP TRIGGER IF EXISTS memory_docs_languages_upd ON memory_docs;
CREATE TRIGGER memory_docs_languages_upd AFTER UPDATE ON memory_docs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION memory_docs_languages();

DROP INDEX IF EXISTS memory_docs_terms_due_2;
CREATE INDEX IF NOT EXISTS memory_docs_terms_due_3 ON memory_docs (scope, path)
    WHERE terms_version < 3;

-- Migration 012's function (English stems) stays beside it, for a worker of the version
-- before while others are upgraded; what it indexes is at version 2, indexed again here.
CREATE OR REPLACE FUNCTION memory_doc_tsv(title text, tags text, body text, max_chars int,
                                          x_title text, x_tags text, x_body text,
                                          lang regconfig)
RETURNS tsvector LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    own tsvector := setweight(to_tsvector('simple', title), 'A')
                    || setweight(to_tsvector('simple', tags), 'B')
                    || setweight(to_tsvector('simple', left(body, max_chars)), 'D');
    extra tsvector := setweight(to_tsvector(lang, title), 'A')
                      || setweight(to_tsvector(lang, tags), 'B')
                      || setweight(to_tsvector(lang, left(body, max_chars)), 'D');
BEGIN
    IF x_title <> '' OR x_tags <> '' OR x_body <> '' THEN
        extra := extra || setweight(to_tsvector('simple', x_title), 'A')
                       || setweight(to_tsvector('simple', x_tags), 'B')
                       || setweight(to_tsvector('simple', x_body), 'D');
    END IF;
    RETURN own || ts_delete(extra, tsvector_to_array(own));
END
$$;
