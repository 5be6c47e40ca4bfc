"""Migration 004: a deployment's single vault and its index become the default scope's,
nothing lost; a new scope's documents get statistics of their own."""

from __future__ import annotations

import os

import psycopg

import activities.db as db
from activities.db import apply_migrations
from activities.vault.context import scope_vaults
from activities.vault.search import search
from schemas.vault.settings import MemorySettings

LEGACY = """
INSERT INTO sessions (session_id) VALUES ('old-session');
INSERT INTO memory_docs (path, kind, title, body, card_key, content_hash, tsv, doc_len)
SELECT 'cards/notes/Kettle order.md', 'card', 'Kettle order',
       'Order A-1001: the blue kettle ships on Tuesday', 'kettle order', 'h1', v.tsv,
       (SELECT sum(cardinality(u.positions)) FROM unnest(v.tsv) u)
FROM (SELECT to_tsvector('simple', 'Kettle order Order A-1001 the blue kettle ships on Tuesday')
      AS tsv) v;
INSERT INTO memory_links (src, dst) VALUES ('kettle order', 'anna petrova');
INSERT INTO rollup_plans (plan_id, kind, period, plan) VALUES ('daily:2026-06-01', 'daily',
    '2026-06-01', '{}');
INSERT INTO vault_ops (op_id, state) VALUES ('daily:2026-06-01:0', 'applied');
INSERT INTO rollup_runs (kind, period, result) VALUES ('daily', '2026-06-01', '{}');
"""


async def test_the_single_vault_becomes_the_default_scope(pg_admin_url, tmp_path,
                                                           monkeypatch):
    name = f"keel_scope_mig_{os.getpid()}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = pg_admin_url.replace("/postgres?", f"/{name}?")
    before = [p for p in db.migration_files() if p.name < "004"]
    monkeypatch.setattr(db, "migration_files", lambda: before)
    apply_migrations(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(LEGACY)
    monkeypatch.undo()
    assert "004_memory_scopes.sql" in apply_migrations(url)

    with psycopg.connect(url) as conn:
        for table in ("memory_docs", "memory_links", "rollup_plans", "vault_ops",
                      "rollup_runs", "memory_terms"):
            scopes = {r[0] for r in conn.execute(f"SELECT scope FROM {table}")}
            assert scopes == {"default"}, table
        assert conn.execute("SELECT scope, n_docs FROM memory_stats").fetchall() == [
            ("default", 1)]
        assert conn.execute("SELECT memory_scope FROM sessions").fetchall() == [("default",)]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        hits = await search(conn, "blue kettle", scope="default")
        assert [h.path for h in hits] == ["cards/notes/Kettle order.md"]
        assert await search(conn, "blue kettle", scope="alice") == []
        # A second scope's document: its own statistics, the default's unchanged.
        await conn.execute(
            "INSERT INTO memory_docs (scope, path, kind, body, content_hash, tsv, doc_len)"
            " VALUES ('alice', 'cards/notes/Kettle order.md', 'card', 'red kettle', 'h2',"
            " to_tsvector('simple', 'red kettle'), 2)")
        stats = await (await conn.execute(
            "SELECT scope, n_docs FROM memory_stats ORDER BY scope")).fetchall()
        assert stats == [("alice", 1), ("default", 1)]
        assert [h.path for h in await search(conn, "kettle", scope="alice")] == [
            "cards/notes/Kettle order.md"]
        hits = await search(conn, "red", scope="default")
        assert hits == []

    # The vault folder itself stays where it was, as the default scope's.
    legacy = tmp_path / "vault"
    (legacy / "cards").mkdir(parents=True)
    memory = MemorySettings(vault_dir=legacy)
    assert scope_vaults(memory) == {"default": legacy}
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
