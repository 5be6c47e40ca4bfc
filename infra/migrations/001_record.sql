-- The conversation of record: every input and reply, counted once at insert.
CREATE TABLE IF NOT EXISTS sessions (
    session_id  text PRIMARY KEY,
    user_name   text NOT NULL DEFAULT 'user',
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS messages (
    session_id    text        NOT NULL REFERENCES sessions (session_id),
    seq           bigint      NOT NULL,
    input_id      text        NOT NULL,
    type          text        NOT NULL
        CHECK (type IN ('user', 'harness', 'assistant', 'tool_result', 'notice', 'checkpoint')),
    source_line   text,
    content_text  text        NOT NULL,
    content       jsonb,
    token_count   integer     NOT NULL,
    turn          integer,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, seq),
    UNIQUE (session_id, input_id)
);

CREATE INDEX IF NOT EXISTS messages_session_type_seq ON messages (session_id, type, seq);
