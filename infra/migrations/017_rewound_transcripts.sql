-- A rewind takes back what the abandoned rows said from long memory too (activities.branch
-- queues it with the rewind's marks, activities.vault.outbox drains it): a row of
-- `transcript_outbox` with `forget` true names, in `seqs`, rewound messages whose
-- daily-note entries the vault worker removes (their files rewritten with the rest byte
-- for byte, their index rows deleted). It is keyed by the rewind's last rewound seq, so
-- it may share a `reply_seq` with an append row: the key names the kind too.
ALTER TABLE transcript_outbox ADD COLUMN IF NOT EXISTS forget BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE transcript_outbox DROP CONSTRAINT IF EXISTS transcript_outbox_session_id_reply_seq_key;
ALTER TABLE transcript_outbox ADD CONSTRAINT transcript_outbox_once UNIQUE (session_id, forget, reply_seq);
