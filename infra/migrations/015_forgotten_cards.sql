-- Cards a person had long memory forget (`keel vault forget`, activities.vault.forget): the
-- card's file and index rows are gone; this row keeps the nightly rollup and a checkpoint's
-- memory flush from writing it again out of material of that day or before (the day's
-- transcript still says what was said). The agent's own write_card, a live decision, may.
-- The card's title is kept to say what was forgotten; erasing the scope takes the row.
CREATE TABLE IF NOT EXISTS memory_forgotten (
    scope         text        NOT NULL,
    card_key      text        NOT NULL,   -- schemas.vault.card.link_key of its file name
    title         text        NOT NULL,
    forgotten_on  date        NOT NULL,   -- the vault's local day it was forgotten
    forgotten_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, card_key)
);
