-- A turn's transcript, queued with its reply (activities.vault.outbox): one row per model
-- call that recorded a reply, written in the reply's transaction, drained by the vault
-- worker that owns `vault_queue` and deleted once the vault holds it. `seqs` are the
-- messages to append (the call's inputs, then its reply when it has text), `recalled` the
-- recall's hits whose access count goes up. A row that keeps failing is retried with
-- backoff (`attempts`, `next_try_at`, `last_error`) and, past the last attempt, said to
-- the session and dropped: the record keeps the messages, the nightly rollup reads it.
CREATE TABLE IF NOT EXISTS transcript_outbox (
    id BIGSERIAL PRIMARY KEY,
    vault_queue TEXT NOT NULL,
    session_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    reply_seq BIGINT NOT NULL,
    seqs BIGINT[] NOT NULL,
    recalled TEXT[] NOT NULL DEFAULT '{}',
    attempts INT NOT NULL DEFAULT 0,
    last_error TEXT,
    next_try_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (session_id, reply_seq)
);
CREATE INDEX IF NOT EXISTS transcript_outbox_due ON transcript_outbox (vault_queue, next_try_at, id);
