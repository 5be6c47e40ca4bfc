-- A deployment's own secrets, made once by the first process that needs one and never sent
-- anywhere. `bundle-seal`: the Ed25519 private key a session bundle's end line is signed
-- with (schemas.bundle_seal), so an import can tell a bundle this deployment (or one it
-- trusts, by its public key) wrote, unchanged, from one made or edited elsewhere. Whoever
-- can read this table can write the record itself, so the key guards nothing more than
-- the record does.
CREATE TABLE IF NOT EXISTS deployment_keys (
    name        text        PRIMARY KEY,
    secret      bytea       NOT NULL CHECK (octet_length(secret) >= 32),
    created_at  timestamptz NOT NULL DEFAULT now()
);
