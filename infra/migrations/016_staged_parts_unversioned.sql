-- An upload's parts (schemas.uploads.STAGING, `.keel/uploads/<id>/NNNNNN`) are not the
-- session's files: they live for the few seconds of a put. Migration 006's trigger kept
-- every one in the workspace's history for good (a 9.5 MB put left 9.5 MB of parts there
-- and a deletion row each), which a fork then copied and an export carried. The history
-- skips them now, and what it kept of them goes.
CREATE OR REPLACE FUNCTION workspace_file_history() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('keel.branch_copy', true) = 'on' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        IF NOT starts_with(OLD.path, '.keel/uploads/') THEN
            INSERT INTO workspace_file_versions (scope, path, version, data, size)
                VALUES (OLD.scope, OLD.path, OLD.version + 1, NULL, 0);
        END IF;
    ELSIF NOT starts_with(NEW.path, '.keel/uploads/') THEN
        INSERT INTO workspace_file_versions (scope, path, version, data, size)
            VALUES (NEW.scope, NEW.path, NEW.version, NEW.data, NEW.size);
    END IF;
    RETURN NULL;
END
$$;

DELETE FROM workspace_file_versions WHERE starts_with(path, '.keel/uploads/');
