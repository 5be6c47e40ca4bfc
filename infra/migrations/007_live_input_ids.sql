-- An input id is unique among a session's live rows only (issue 25): a row a rewind
-- abandoned keeps its id, and an input sent again with that id after the rewind is a new
-- input, not a duplicate of the abandoned one. A row's id stays unique among the live
-- rows, which is what the record's insert-once (ON CONFLICT DO NOTHING) relies on.
ALTER TABLE messages DROP CONSTRAINT IF EXISTS messages_session_id_input_id_key;
CREATE UNIQUE INDEX IF NOT EXISTS messages_live_input_id
    ON messages (session_id, input_id) WHERE rewound_by IS NULL;
