-- Session workspaces in PostgreSQL (KEEL_WORKSPACE_STORE=postgres): any worker reads and
-- writes them. `version` rises by one with each write of a file; `workspace_writes` keeps
-- which write (the tool call's op id) made which version, so a retried write is not applied
-- twice. The scope '_shared' holds what every session reads (shared skills).
CREATE TABLE IF NOT EXISTS workspace_files (
    scope       text        NOT NULL,
    path        text        NOT NULL,
    version     bigint      NOT NULL,
    data        bytea       NOT NULL,
    size        bigint      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, path)
);

CREATE TABLE IF NOT EXISTS workspace_writes (
    scope       text        NOT NULL,
    op_id       text        NOT NULL,
    path        text        NOT NULL,
    version     bigint      NOT NULL,
    written_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, op_id)
);
