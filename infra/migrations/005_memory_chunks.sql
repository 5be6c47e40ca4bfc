-- Long memory's dense index (issue 23): every document as chunks with their heading path and
-- place in the document, each with its vector from one embedding model. It replaces
-- memory_embeddings (one vector per document, of its first 4,000 characters); the vectors
-- are derived data, rebuilt by `embed_pending` on the vault worker's beat.
--
-- The vector column is pgvector's `vector` where the server has the extension (the embedded
-- PostgreSQL ships it), searched in SQL by cosine distance; elsewhere a plain real[] that
-- the worker searches exactly. The search code reads which from the column's type.

DROP TABLE IF EXISTS memory_embeddings;

-- A role that may not create extensions gets the plain arrays (a superuser can add the
-- extension later; the worker keeps searching exactly until the column is converted).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector') THEN
        BEGIN
            CREATE EXTENSION IF NOT EXISTS vector;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'pgvector is available but this role may not create it: %', SQLERRM;
        END;
    END IF;
END $$;

DO $$
DECLARE
    vec_type text := CASE WHEN EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector')
                          THEN 'vector' ELSE 'real[]' END;
BEGIN
    EXECUTE format($f$
        CREATE TABLE IF NOT EXISTS memory_chunks (
            scope         text NOT NULL,
            path          text NOT NULL,
            chunk         integer NOT NULL,        -- 0, 1, ... in document order
            heading       text NOT NULL DEFAULT '', -- the heading path, ' > ' between levels
            start_char    integer NOT NULL,        -- the chunk is body[start_char:end_char]
            end_char      integer NOT NULL,
            -- Copied from the document so a dense search filters without a join; the
            -- content hash covers all three, so a change re-embeds the document.
            kind          text NOT NULL,
            session_id    text,
            penalised     boolean NOT NULL DEFAULT false,
            model         text NOT NULL,           -- the embedder's name
            content_hash  text NOT NULL,           -- the document's hash when embedded
            embedding     %s NOT NULL,
            PRIMARY KEY (scope, path, chunk),
            FOREIGN KEY (scope, path) REFERENCES memory_docs (scope, path) ON DELETE CASCADE
        )$f$, vec_type);
END $$;
CREATE INDEX IF NOT EXISTS memory_chunks_model ON memory_chunks (scope, model);

-- BM25's statistics kept by statement, not by row: one statement indexing a batch of
-- documents (index_documents) updates each term's document frequency once, with the
-- batch's count, instead of once per document (the per-row trigger made bulk indexing
-- ~2 ms a document). Same figures as before: a recount always matches them.
DROP TRIGGER IF EXISTS memory_docs_stats_ins ON memory_docs;
DROP TRIGGER IF EXISTS memory_docs_stats_upd ON memory_docs;
DROP FUNCTION IF EXISTS memory_docs_stats();

CREATE OR REPLACE FUNCTION memory_docs_stats_ins() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Terms in sorted order so concurrent writers never deadlock.
    INSERT INTO memory_terms AS t (scope, term, df)
    SELECT r.scope, u.lexeme, count(*) FROM new_rows r, unnest(r.tsv) u
    GROUP BY r.scope, u.lexeme ORDER BY r.scope, u.lexeme
    ON CONFLICT (scope, term) DO UPDATE SET df = t.df + EXCLUDED.df;
    INSERT INTO memory_stats AS s (scope, n_docs, total_len)
    SELECT scope, count(*), coalesce(sum(doc_len), 0) FROM new_rows GROUP BY scope
    ORDER BY scope
    ON CONFLICT (scope) DO UPDATE SET n_docs = s.n_docs + EXCLUDED.n_docs,
                                      total_len = s.total_len + EXCLUDED.total_len;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION memory_docs_stats_del() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE memory_terms t SET df = t.df - d.n
      FROM (SELECT r.scope, u.lexeme, count(*) AS n FROM old_rows r, unnest(r.tsv) u
            GROUP BY r.scope, u.lexeme ORDER BY r.scope, u.lexeme) d
     WHERE t.scope = d.scope AND t.term = d.lexeme;
    UPDATE memory_stats s SET n_docs = s.n_docs - d.n, total_len = s.total_len - d.len
      FROM (SELECT scope, count(*) AS n, coalesce(sum(doc_len), 0) AS len FROM old_rows
            GROUP BY scope) d
     WHERE s.scope = d.scope;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION memory_docs_stats_upd() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Only rows whose words changed move the statistics (an access count does not).
    WITH changed AS (
        SELECT o.scope, o.tsv AS old_tsv, n.tsv AS new_tsv, o.doc_len AS old_len,
               n.doc_len AS new_len
          FROM old_rows o JOIN new_rows n ON n.scope = o.scope AND n.path = o.path
         WHERE o.tsv IS DISTINCT FROM n.tsv OR o.doc_len <> n.doc_len
    ), delta AS (
        SELECT scope, lexeme, sum(n) AS n FROM (
            SELECT c.scope, u.lexeme, -1 AS n FROM changed c, unnest(c.old_tsv) u
            UNION ALL
            SELECT c.scope, u.lexeme, 1 FROM changed c, unnest(c.new_tsv) u) x
        GROUP BY scope, lexeme HAVING sum(n) <> 0 ORDER BY scope, lexeme
    )
    INSERT INTO memory_terms AS t (scope, term, df)
    SELECT scope, lexeme, n FROM delta
    ON CONFLICT (scope, term) DO UPDATE SET df = t.df + EXCLUDED.df;
    UPDATE memory_stats s SET total_len = s.total_len + d.len
      FROM (SELECT o.scope, sum(n.doc_len - o.doc_len) AS len
              FROM old_rows o JOIN new_rows n ON n.scope = o.scope AND n.path = o.path
             GROUP BY o.scope) d
     WHERE s.scope = d.scope AND d.len <> 0;
    RETURN NULL;
END $$;

CREATE TRIGGER memory_docs_stats_ins AFTER INSERT ON memory_docs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION memory_docs_stats_ins();
CREATE TRIGGER memory_docs_stats_del AFTER DELETE ON memory_docs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION memory_docs_stats_del();
CREATE TRIGGER memory_docs_stats_upd AFTER UPDATE ON memory_docs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION memory_docs_stats_upd();
