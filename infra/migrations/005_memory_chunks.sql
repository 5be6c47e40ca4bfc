-- Long memory's dense index (issue 23): every document as chunks with their heading path and
-- place in the document, each with its vector from one embedding model. It replaces
-- memory_embeddings (one vector per document, of its first 4,000 characters); the vectors
-- are derived data, rebuilt by `embed_pending` on the vault worker's beat.
--
-- The vector column is pgvector's `vector` where the server has the extension (the embedded
-- PostgreSQL ships it), searched in SQL by cosine distance; elsewhere a plain real[] that
-- the worker searches exactly. The search code reads which from the column's type.

DROP TABLE IF EXISTS memory_embeddings;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector') THEN
        CREATE EXTENSION IF NOT EXISTS vector;
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
