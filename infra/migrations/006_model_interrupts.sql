-- A model call a new message interrupted (schemas.interrupt): the call's reply seq, kept so
-- a call that starts listening after the interrupt was sent still sees it.
CREATE TABLE IF NOT EXISTS model_interrupts (
    session_id TEXT NOT NULL,
    reply_seq BIGINT NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, reply_seq)
);
