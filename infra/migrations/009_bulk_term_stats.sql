-- BM25's statistics counted once per bulk load (issue 23). A large load
-- (activities.vault.bulk) writes its batches with `keel.defer_term_stats` set to 'on' in
-- each batch's transaction (SET LOCAL): the statement triggers then leave memory_terms and
-- memory_stats alone, and the load recounts its scope from the documents at its end
-- (activities.vault.search.rebuild_statistics). Per batch, the triggers' upserts into
-- memory_terms cost more than a recount of the whole scope, and two connections writing
-- batches at once would wait on each other's term rows.
--
-- `recount_due` is set, committed, before such a load's first batch and cleared by the
-- recount: a load that never reached its end (a killed worker) leaves it set, and the
-- scope's next bulk load (the doctor's nightly reindex is one) recounts. Every other
-- writer keeps the statistics exact, as before.

ALTER TABLE memory_stats ADD COLUMN IF NOT EXISTS recount_due boolean NOT NULL DEFAULT false;

CREATE OR REPLACE FUNCTION memory_docs_stats_ins() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('keel.defer_term_stats', true) = 'on' THEN
        RETURN NULL;
    END IF;
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
    IF current_setting('keel.defer_term_stats', true) = 'on' THEN
        RETURN NULL;
    END IF;
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
    IF current_setting('keel.defer_term_stats', true) = 'on' THEN
        RETURN NULL;
    END IF;
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
