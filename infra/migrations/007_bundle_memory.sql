-- A bundle's long memory (issue 25): the cards a session wrote in its memory scope's vault
-- and its own daily-note entries travel in a bundle (format version 2). The vault has one
-- writer (its own task queue), so neither an export nor an import touches its files
-- itself: the vault activity (activities.bundle_memory) stages what an export reads here,
-- and an import's transaction stages what the vault activity then writes (and drains).
--
-- `direction`: 'export' rows are filled by the vault activity and read (then deleted) by
-- the export; 'import' rows are filled by the import's transaction and written by the
-- vault activity, which marks each `written` as it goes (a retry skips those) and deletes
-- them once all are.
CREATE TABLE IF NOT EXISTS bundle_memory (
    request_id  text        NOT NULL,
    direction   text        NOT NULL CHECK (direction IN ('export', 'import')),
    scope       text        NOT NULL,
    session_id  text        NOT NULL,
    kind        text        NOT NULL CHECK (kind IN ('card', 'daily')),
    path        text        NOT NULL,          -- vault-relative
    seq         bigint      NOT NULL DEFAULT 0, -- a daily entry's seq; 0 for a card
    body        jsonb       NOT NULL,          -- the bundle line's object
    written     boolean     NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id, direction, kind, path, seq)
);
