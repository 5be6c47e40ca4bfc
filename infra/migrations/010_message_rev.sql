-- Every message row carries a revision (`rev`) that changes whenever the row is written:
-- every insert and every update takes the next value of `message_rev` (the trigger, which
-- overrides whatever the statement gave: a bundle's or a branch's copied rows get
-- revisions of this database; an ON CONFLICT DO UPDATE fires it too). Equal (seq, rev)
-- therefore means an equal row, which is what a worker's copy of a window's rows is
-- checked against on every read (activities.row_cache): the record still says which rows
-- are in a window, and each one's revision, every time; a worker re-reads and re-decodes
-- only the rows it does not hold at that revision. A deleted row is absent from the next
-- read.
CREATE SEQUENCE IF NOT EXISTS message_rev;
ALTER TABLE messages ADD COLUMN IF NOT EXISTS rev BIGINT NOT NULL DEFAULT nextval('message_rev');

CREATE OR REPLACE FUNCTION messages_next_rev() RETURNS trigger AS $$
BEGIN
    NEW.rev := nextval('message_rev');
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS messages_rev ON messages;
CREATE TRIGGER messages_rev BEFORE INSERT OR UPDATE ON messages
    FOR EACH ROW EXECUTE FUNCTION messages_next_rev();
