-- Checkpoints: each attempt's working data, and the stored checkpoint the window starts from.
CREATE TABLE IF NOT EXISTS checkpoint_attempts (
    attempt_id          text PRIMARY KEY,
    session_id          text NOT NULL REFERENCES sessions (session_id),
    cut_seq             bigint NOT NULL,      -- first seq that stays verbatim in the window
    upto_seq            bigint NOT NULL,      -- the conversation as it stood
    previous_mind       text NOT NULL,
    checklist_original  text NOT NULL,
    candidates          jsonb NOT NULL,       -- [{seq, tokens, kept_before}]
    in_turn_user_seqs   jsonb NOT NULL DEFAULT '[]',
    mind_path           text NOT NULL,
    memo_path           text NOT NULL,
    rounds              jsonb NOT NULL DEFAULT '[]',   -- the checkpoint turn's own messages
    rounds_used         integer NOT NULL DEFAULT 0,
    final_text          text,
    problems            jsonb NOT NULL DEFAULT '[]',
    repair_sent         boolean NOT NULL DEFAULT false,
    outcome             text,                  -- stored | failed
    failure_reason      text,
    created_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS checkpoints (
    checkpoint_id       text PRIMARY KEY,     -- derived from the attempt: a retry writes one row
    session_id          text NOT NULL REFERENCES sessions (session_id),
    kind                text NOT NULL CHECK (kind IN ('model', 'move_half')),
    record_seq          bigint NOT NULL,      -- the recap row in messages
    cut_seq             bigint NOT NULL,
    upto_seq            bigint NOT NULL,      -- the conversation it was taken over
    mind_text           text NOT NULL,        -- the whole mind, always kept in the record
    mind_context_text   text NOT NULL,        -- the mind as the context shows it
    memo                jsonb NOT NULL,       -- [{seq, text, cut}]
    memo_dropped_seqs   jsonb NOT NULL DEFAULT '[]',
    now_text            text NOT NULL,
    skills              jsonb NOT NULL DEFAULT '[]',
    files_modified      jsonb NOT NULL DEFAULT '[]',
    files_read          jsonb NOT NULL DEFAULT '[]',
    fallbacks           jsonb NOT NULL DEFAULT '[]',
    rendered            text NOT NULL,
    rendered_tokens     integer NOT NULL,
    tokens_moved_out    integer NOT NULL DEFAULT 0,
    window_tokens_before integer NOT NULL DEFAULT 0,  -- the context it was taken from
    window_tokens_after integer NOT NULL DEFAULT 0,   -- the context it leaves
    carried_seqs        jsonb NOT NULL DEFAULT '[]',  -- this turn's user messages, kept verbatim
    created_at          timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS checkpoints_session ON checkpoints (session_id, created_at);
