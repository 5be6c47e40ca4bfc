-- Each workspace scope's total size, kept by the database itself: a write checks the
-- scope's quota against `total_bytes` (one row, locked for the write's transaction)
-- instead of summing every file of the scope. Statement triggers keep the total equal to
-- sum(size) of the scope's rows whatever changes them (the store's writes, a COPY, a
-- DELETE by hand); the backfill below runs under the triggers' table lock, so no write
-- lands between the two.
CREATE TABLE IF NOT EXISTS workspace_scopes (
    scope        text   PRIMARY KEY,
    total_bytes  bigint NOT NULL DEFAULT 0
);

CREATE OR REPLACE FUNCTION workspace_scope_totals() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO workspace_scopes AS s (scope, total_bytes)
            SELECT scope, sum(size) FROM new_rows GROUP BY scope
        ON CONFLICT (scope) DO UPDATE SET total_bytes = s.total_bytes + excluded.total_bytes;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO workspace_scopes AS s (scope, total_bytes)
            SELECT scope, sum(delta) FROM (
                SELECT scope, size AS delta FROM new_rows
                UNION ALL
                SELECT scope, -size FROM old_rows) AS d
            GROUP BY scope
        ON CONFLICT (scope) DO UPDATE SET total_bytes = s.total_bytes + excluded.total_bytes;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE workspace_scopes AS s SET total_bytes = s.total_bytes - d.bytes
            FROM (SELECT scope, sum(size) AS bytes FROM old_rows GROUP BY scope) AS d
            WHERE s.scope = d.scope;
    ELSE  -- TRUNCATE
        DELETE FROM workspace_scopes;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS workspace_totals_insert ON workspace_files;
CREATE TRIGGER workspace_totals_insert AFTER INSERT ON workspace_files
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION workspace_scope_totals();
DROP TRIGGER IF EXISTS workspace_totals_update ON workspace_files;
CREATE TRIGGER workspace_totals_update AFTER UPDATE ON workspace_files
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION workspace_scope_totals();
DROP TRIGGER IF EXISTS workspace_totals_delete ON workspace_files;
CREATE TRIGGER workspace_totals_delete AFTER DELETE ON workspace_files
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION workspace_scope_totals();
DROP TRIGGER IF EXISTS workspace_totals_truncate ON workspace_files;
CREATE TRIGGER workspace_totals_truncate AFTER TRUNCATE ON workspace_files
    FOR EACH STATEMENT EXECUTE FUNCTION workspace_scope_totals();

INSERT INTO workspace_scopes (scope, total_bytes)
    SELECT scope, sum(size) FROM workspace_files GROUP BY scope
ON CONFLICT (scope) DO UPDATE SET total_bytes = excluded.total_bytes;
