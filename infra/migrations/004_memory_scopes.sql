-- Memory scopes (issue 14): every long-memory table gains a `scope` column and every key
-- includes it, so one scope's documents, term statistics, links, embeddings, plans, ops
-- and finished rollups never meet another's. Existing rows become the default scope's.

ALTER TABLE memory_embeddings DROP CONSTRAINT IF EXISTS memory_embeddings_path_fkey;

ALTER TABLE memory_docs ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT 'default';
ALTER TABLE memory_docs DROP CONSTRAINT memory_docs_pkey;
ALTER TABLE memory_docs ADD PRIMARY KEY (scope, path);
DROP INDEX IF EXISTS memory_docs_card_key;
CREATE INDEX memory_docs_card_key ON memory_docs (scope, card_key);
DROP INDEX IF EXISTS memory_docs_session;
CREATE INDEX memory_docs_session ON memory_docs (scope, session_id);

ALTER TABLE memory_embeddings ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT 'default';
ALTER TABLE memory_embeddings DROP CONSTRAINT memory_embeddings_pkey;
ALTER TABLE memory_embeddings ADD PRIMARY KEY (scope, path);
ALTER TABLE memory_embeddings ADD FOREIGN KEY (scope, path)
    REFERENCES memory_docs (scope, path) ON DELETE CASCADE;

-- BM25 statistics per scope: one scope's words never shift another's ranking.
ALTER TABLE memory_terms ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT 'default';
ALTER TABLE memory_terms DROP CONSTRAINT memory_terms_pkey;
ALTER TABLE memory_terms ADD PRIMARY KEY (scope, term);
DROP INDEX IF EXISTS memory_terms_prefix;
CREATE INDEX memory_terms_prefix ON memory_terms (scope, term text_pattern_ops);

ALTER TABLE memory_stats ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT 'default';
ALTER TABLE memory_stats DROP CONSTRAINT memory_stats_pkey;
ALTER TABLE memory_stats DROP COLUMN id;
ALTER TABLE memory_stats ADD PRIMARY KEY (scope);

CREATE OR REPLACE FUNCTION memory_docs_stats() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Terms are touched in sorted order so concurrent writers never deadlock.
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        UPDATE memory_terms t SET df = t.df - 1
          FROM (SELECT lexeme FROM unnest(OLD.tsv) ORDER BY lexeme) u
         WHERE t.scope = OLD.scope AND t.term = u.lexeme;
        UPDATE memory_stats SET n_docs = n_docs - 1, total_len = total_len - OLD.doc_len
         WHERE scope = OLD.scope;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        INSERT INTO memory_terms AS t (scope, term, df)
        SELECT NEW.scope, lexeme, 1 FROM unnest(NEW.tsv) ORDER BY lexeme
        ON CONFLICT (scope, term) DO UPDATE SET df = t.df + 1;
        INSERT INTO memory_stats AS s (scope, n_docs, total_len)
        VALUES (NEW.scope, 1, NEW.doc_len)
        ON CONFLICT (scope) DO UPDATE SET n_docs = s.n_docs + 1,
                                          total_len = s.total_len + NEW.doc_len;
    END IF;
    RETURN NULL;
END $$;

ALTER TABLE memory_links ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT 'default';
ALTER TABLE memory_links DROP CONSTRAINT memory_links_pkey;
ALTER TABLE memory_links ADD PRIMARY KEY (scope, src, dst);
DROP INDEX IF EXISTS memory_links_dst;
CREATE INDEX memory_links_dst ON memory_links (scope, dst);

ALTER TABLE rollup_plans ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT 'default';
ALTER TABLE rollup_plans DROP CONSTRAINT rollup_plans_pkey;
ALTER TABLE rollup_plans ADD PRIMARY KEY (scope, plan_id);

ALTER TABLE vault_ops ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT 'default';
ALTER TABLE vault_ops DROP CONSTRAINT vault_ops_pkey;
ALTER TABLE vault_ops ADD PRIMARY KEY (scope, op_id);

ALTER TABLE rollup_runs ADD COLUMN IF NOT EXISTS scope text NOT NULL DEFAULT 'default';
ALTER TABLE rollup_runs DROP CONSTRAINT rollup_runs_pkey;
ALTER TABLE rollup_runs ADD PRIMARY KEY (scope, kind, period);

-- The session's scope, mirrored from its workflow config by the model call: the system
-- prompt of any step (the checkpoint turn's too) takes its core memory from it. NULL: the
-- session has no long memory. Sessions that existed before scopes are the default's; a
-- new row has none until its first model call says which (fail closed: no core memory).
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS memory_scope text DEFAULT 'default';
ALTER TABLE sessions ALTER COLUMN memory_scope DROP DEFAULT;
