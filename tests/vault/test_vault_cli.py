"""`keel vault ...`: scopes listed, and doctor and search run on the scope named by
--scope only (a real worker, the dev server, PostgreSQL)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from typer.testing import CliRunner

from keel.cli import app
from tests.harness import keel_worker, make_settings
from tests.vault.scope_seeds import seed


@pytest.fixture
def settings(database_url, tmp_path):
    return make_settings(database_url, tmp_path)


@pytest.fixture
def env(client, settings, database_url, tmp_path):
    return {"TEMPORAL_ADDRESS": client.service_client.config.target_host,
            "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": settings.task_queue,
            "KEEL_DATA_DIR": str(tmp_path), "ANTHROPIC_API_KEY": "",
            "ANTHROPIC_BASE_URL": "", "COLUMNS": "200"}


async def keel(env, *args):
    return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=env)


async def test_vault_commands_take_the_scope(client, settings, env, database_url, tmp_path):
    await seed(settings, database_url, "alice")
    await seed(settings, database_url, "bob")
    listed = await keel(env, "vault", "list")
    assert listed.exit_code == 0, listed.output
    assert "alice" in listed.output and "bob" in listed.output
    assert "default" not in listed.output  # no default vault was ever made here

    found = await keel(env, "vault", "search", "kettle order", "--scope", "bob")
    assert found.exit_code == 0, found.output
    assert "B-2002" in found.output and "A-1001" not in found.output
    misspelt = await keel(env, "vault", "search", "ketle", "--scope", "bob")
    assert misspelt.exit_code == 0, misspelt.output
    assert '"kettle" for "ketle"' in misspelt.output and "B-2002" in misspelt.output
    bad = await keel(env, "vault", "search", "kettle", "--scope", "../alice")
    assert bad.exit_code == 1 and "not a valid scope id" in bad.output
    for blank in ("", "  \t"):
        empty = await keel(env, "vault", "search", blank, "--scope", "bob")
        assert empty.exit_code == 1 and "give words to search for" in empty.output

    async with keel_worker(client, settings):
        doctor = await keel(env, "vault", "doctor", "--scope", "bob")
        # A mistyped scope is no scope: the doctor and a rollup would have made it one (a
        # vault folder, a repository, CORE.md and an index row), a search found "nothing".
        for args in (("doctor",), ("rollup", "daily"), ("search", "kettle"),
                     ("show", "MOC.md")):
            typo = await keel(env, "vault", *args, "--scope", "bobb")
            assert typo.exit_code == 1, (args, typo.output)
            assert "no memory scope 'bobb' (the scopes: alice, bob" in typo.output
    assert not (tmp_path / "vaults" / "bobb").exists()
    assert "bobb" not in (await keel(env, "vault", "list")).output
    assert doctor.exit_code == 0, doctor.output
    assert "Keel doctor" in doctor.output
    # The doctor ran on bob's vault only: its health history, its MOC.
    assert (tmp_path / "vaults" / "bob" / ".graph" / "health-history.jsonl").exists()
    assert "Kettle order" in (tmp_path / "vaults" / "bob" / "MOC.md").read_text()
    assert not (tmp_path / "vaults" / "alice" / ".graph" / "health-history.jsonl").exists()


async def test_vault_list_shows_the_transcripts_still_queued(settings, env, database_url):
    await seed(settings, database_url, "alice")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO sessions (session_id) VALUES ('q-1')")
        for seq, attempts, error in ((2, 0, None), (4, 2, "OSError: disk full"),
                                     (6, 0, None)):
            conn.execute(
                "INSERT INTO transcript_outbox (vault_queue, session_id, scope, reply_seq,"
                " seqs, attempts, last_error) VALUES ('q', 'q-1', %s, %s, %s, %s, %s)",
                ("carol" if seq == 6 else "alice", seq, [seq - 1, seq], attempts, error))
    listed = await keel(env, "vault", "list")
    assert listed.exit_code == 0, listed.output
    rows = {line.split()[1]: line for line in listed.output.splitlines()
            if line.split()[1:2] and line.split()[1] in ("alice", "carol")}
    assert "2 (1 retrying: OSError: disk full)" in rows["alice"]
    assert "no vault yet" in rows["carol"] and rows["carol"].rstrip(" │").endswith("1")


async def test_vault_list_names_a_scope_whose_vault_is_on_another_host(settings, env,
                                                                       database_url):
    """A cluster's command line runs where no vault folder is: a scope the index holds is
    listed, with its documents, where before only this host's folders were."""
    await seed(settings, database_url, "alice")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO memory_stats (scope, n_docs, total_len) VALUES"
                     " ('dave', 3, 120)")
        docs = conn.execute("SELECT n_docs FROM memory_stats WHERE scope = 'alice'"
                            ).fetchone()
    listed = await keel(env, "vault", "list")
    assert listed.exit_code == 0, listed.output
    rows = {line.split()[1]: line for line in listed.output.splitlines()
            if line.split()[1:2] and line.split()[1] in ("alice", "dave")}
    assert "on the vault worker's host" in rows["dave"]
    assert [c.strip() for c in rows["dave"].split("│")][-3:-1] == ["3", "0"]
    assert docs is not None and f" {docs[0]} " in rows["alice"] and "yes" in rows["alice"]


async def test_vault_show_reads_one_document_of_the_scope_named(settings, env, database_url):
    await seed(settings, database_url, "alice")
    await seed(settings, database_url, "bob")
    card = "cards/notes/Kettle order.md"
    bob = await keel(env, "vault", "show", card, "--scope", "bob")
    assert bob.exit_code == 0, bob.output
    assert "B-2002" in bob.output and "A-1001" not in bob.output
    alice = await keel(env, "vault", "show", card, "--scope", "alice")
    assert "A-1001" in alice.output and "B-2002" not in alice.output
    missing = await keel(env, "vault", "show", "cards/notes/Nothing.md", "--scope", "bob")
    assert missing.exit_code == 1 and "nothing at 'cards/notes/Nothing.md'" in missing.output
