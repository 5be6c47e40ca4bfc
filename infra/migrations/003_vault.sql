-- Long memory: the search index over the vault and past conversations, the card link
-- graph, and the ledgers that make rollups and transcript appends idempotent.

-- One row per indexed document: a vault file, or one entry of a daily transcript
-- (path 'daily/2026-06-01.md#<session>:<seq>').
CREATE TABLE IF NOT EXISTS memory_docs (
    path          text PRIMARY KEY,
    kind          text NOT NULL,            -- card | summary | daily | core | note
    title         text NOT NULL DEFAULT '',
    tags          text NOT NULL DEFAULT '',
    body          text NOT NULL,
    card_key      text,                     -- how wikilinks name it (lower-case file stem)
    card_type     text,
    status        text,
    penalised     boolean NOT NULL DEFAULT false,  -- superseded status or stale tier
    session_id    text,
    seq           bigint,
    content_hash  text NOT NULL,
    -- 'simple' configuration: no stemming dictionary, so every language indexes alike.
    -- Weights: A title, B tags, D body (BM25 column weights read them back).
    tsv           tsvector NOT NULL,
    doc_len       integer NOT NULL,         -- tokens, for BM25 length normalisation
    access_count  integer NOT NULL DEFAULT 0,
    last_access   timestamptz,
    indexed_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS memory_docs_tsv ON memory_docs USING GIN (tsv);
CREATE INDEX IF NOT EXISTS memory_docs_card_key ON memory_docs (card_key);
CREATE INDEX IF NOT EXISTS memory_docs_session ON memory_docs (session_id);

-- Document frequency per lexeme and the corpus size, maintained on every write, so BM25
-- has real IDF (ts_rank has none).
CREATE TABLE IF NOT EXISTS memory_terms (
    term  text PRIMARY KEY,
    df    integer NOT NULL
);
CREATE INDEX IF NOT EXISTS memory_terms_prefix ON memory_terms (term text_pattern_ops);

CREATE TABLE IF NOT EXISTS memory_stats (
    id         smallint PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    n_docs     bigint NOT NULL DEFAULT 0,
    total_len  bigint NOT NULL DEFAULT 0
);
INSERT INTO memory_stats (id) VALUES (1) ON CONFLICT DO NOTHING;

CREATE OR REPLACE FUNCTION memory_docs_stats() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Terms are touched in sorted order so concurrent writers never deadlock.
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        UPDATE memory_terms t SET df = t.df - 1
          FROM (SELECT lexeme FROM unnest(OLD.tsv) ORDER BY lexeme) u
         WHERE t.term = u.lexeme;
        UPDATE memory_stats SET n_docs = n_docs - 1, total_len = total_len - OLD.doc_len
         WHERE id = 1;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        INSERT INTO memory_terms AS t (term, df)
        SELECT lexeme, 1 FROM unnest(NEW.tsv) ORDER BY lexeme
        ON CONFLICT (term) DO UPDATE SET df = t.df + 1;
        UPDATE memory_stats SET n_docs = n_docs + 1, total_len = total_len + NEW.doc_len
         WHERE id = 1;
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS memory_docs_stats_ins ON memory_docs;
CREATE TRIGGER memory_docs_stats_ins AFTER INSERT OR DELETE ON memory_docs
    FOR EACH ROW EXECUTE FUNCTION memory_docs_stats();
DROP TRIGGER IF EXISTS memory_docs_stats_upd ON memory_docs;
CREATE TRIGGER memory_docs_stats_upd AFTER UPDATE OF tsv, doc_len ON memory_docs
    FOR EACH ROW WHEN (OLD.tsv IS DISTINCT FROM NEW.tsv OR OLD.doc_len <> NEW.doc_len)
    EXECUTE FUNCTION memory_docs_stats();

-- The card link graph by card key, kept current as cards are indexed.
CREATE TABLE IF NOT EXISTS memory_links (
    src  text NOT NULL,
    dst  text NOT NULL,
    PRIMARY KEY (src, dst)
);
CREATE INDEX IF NOT EXISTS memory_links_dst ON memory_links (dst);

-- Hybrid mode's dense vectors (plain arrays: no server extension needed).
CREATE TABLE IF NOT EXISTS memory_embeddings (
    path          text PRIMARY KEY REFERENCES memory_docs (path) ON DELETE CASCADE,
    model         text NOT NULL,
    content_hash  text NOT NULL,
    vector        real[] NOT NULL
);

-- A rollup's decision, stored before it is applied: a retry reuses it, no second model call.
CREATE TABLE IF NOT EXISTS rollup_plans (
    plan_id     text PRIMARY KEY,           -- kind:period[:chunk]
    kind        text NOT NULL,
    period      text NOT NULL,
    plan        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Each card operation of a plan, recorded before it is applied (pending) and after
-- (applied): a rollup that crashed half way skips what it had done.
CREATE TABLE IF NOT EXISTS vault_ops (
    op_id       text PRIMARY KEY,           -- plan id + fact index
    state       text NOT NULL CHECK (state IN ('pending', 'applied')),
    path        text,
    outcome     text,
    note        text,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Finished rollups, one per kind and period: what catch-up looks at.
CREATE TABLE IF NOT EXISTS rollup_runs (
    kind         text NOT NULL,
    period       text NOT NULL,
    result       jsonb NOT NULL,
    finished_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, period)
);
