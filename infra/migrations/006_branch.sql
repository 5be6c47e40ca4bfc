-- Branching a session (issue 25): fork, rewind, export / import.
--
-- Provenance: a row copied by a fork or an import says where it came from
-- (`origin_session`, `origin_seq`); a session made so says its origin in `sessions`.
-- Rewind marks, never deletes: a row a rewind abandoned keeps its text and gets
-- `rewound_by` (the rewind's id) and `rewound_at`; every window load skips such rows.
ALTER TABLE messages ADD COLUMN IF NOT EXISTS origin_session text;
ALTER TABLE messages ADD COLUMN IF NOT EXISTS origin_seq bigint;
ALTER TABLE messages ADD COLUMN IF NOT EXISTS rewound_by text;
ALTER TABLE messages ADD COLUMN IF NOT EXISTS rewound_at timestamptz;

ALTER TABLE sessions ADD COLUMN IF NOT EXISTS origin_session text;
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS origin_seq bigint;
ALTER TABLE sessions ADD COLUMN IF NOT EXISTS origin_kind text
    CHECK (origin_kind IS NULL OR origin_kind IN ('fork', 'import'));

-- Each rewind of a session, in order: to which seq, and the seqs it abandoned.
CREATE TABLE IF NOT EXISTS session_rewinds (
    rewind_id     text PRIMARY KEY,
    session_id    text NOT NULL REFERENCES sessions (session_id),
    to_seq        bigint NOT NULL,
    first_rewound bigint,
    last_rewound  bigint,
    rows_rewound  integer NOT NULL,
    files_restored integer NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- A fork's or an import's request id: the operation happens once (a retry finds it).
CREATE TABLE IF NOT EXISTS branch_requests (
    request_id    text PRIMARY KEY,
    kind          text NOT NULL CHECK (kind IN ('fork', 'import')),
    session_id    text NOT NULL,
    origin_session text,
    at_seq        bigint,
    result        jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- The workspace's history: every version each file had, and when (a deletion is a row
-- with data NULL). Kept by the database itself, whatever writes `workspace_files`; a
-- fork or an import that brings its own history sets `keel.branch_copy` for its
-- transaction and writes the history rows itself.
CREATE TABLE IF NOT EXISTS workspace_file_versions (
    id          bigserial   PRIMARY KEY,
    scope       text        NOT NULL,
    path        text        NOT NULL,
    version     bigint      NOT NULL,
    data        bytea,
    size        bigint      NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS workspace_file_versions_scope
    ON workspace_file_versions (scope, written_at, id);

CREATE OR REPLACE FUNCTION workspace_file_history() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('keel.branch_copy', true) = 'on' THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        INSERT INTO workspace_file_versions (scope, path, version, data, size)
            VALUES (OLD.scope, OLD.path, OLD.version + 1, NULL, 0);
    ELSE
        INSERT INTO workspace_file_versions (scope, path, version, data, size)
            VALUES (NEW.scope, NEW.path, NEW.version, NEW.data, NEW.size);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS workspace_history ON workspace_files;
CREATE TRIGGER workspace_history AFTER INSERT OR UPDATE OR DELETE ON workspace_files
    FOR EACH ROW EXECUTE FUNCTION workspace_file_history();

INSERT INTO workspace_file_versions (scope, path, version, data, size, written_at)
    SELECT scope, path, version, data, size, updated_at FROM workspace_files;
