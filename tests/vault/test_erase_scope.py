"""Erasing a memory scope end to end, through a real worker, PostgreSQL and Temporal: its
vault folder (with its git history) and every row of it in every table that has a memory
scope are gone, another scope keeps everything, a running session of it refuses the
erasure (nothing erased) unless its sessions go too, and the scope starts afresh after.
`keel vault erase` asks once more and says what went."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from activities.vault_share import shared_vault_text
from activities.workspace import open_store
from keel.cli import app
from keel.client import DeleteRefusedError, KeelClient, session_config
from schemas.vault.doctor import DoctorInput
from schemas.vault.erase import running_text
from schemas.vault.nightly import NightlyInput, NightlyJob, nightly_child_id, now_run_prefix
from schemas.vault.schema import CORE_FILE
from tests.harness import keel_worker, make_settings, until
from tests.session.branching import db
from tests.session.deletion import temporal_forgot
from tests.session.long_memory import CARD_FILE, rememberer, transcribed
from tests.vault.erasing import found, remembered, scope_rows
from workflows.doctor import DoctorWorkflow
from workflows.nightly import MemoryNightlyWorkflow


async def doctor_run(keel: KeelClient, scope: str) -> str:
    """The doctor run now over `scope`, as `keel vault doctor` runs it; its workflow id."""
    run_id = f"{now_run_prefix(NightlyJob.DOCTOR, scope)}{uuid.uuid4().hex[:8]}"
    report = await keel.client.execute_workflow(
        DoctorWorkflow.run, DoctorInput(scope=scope), id=run_id,
        task_queue=keel.settings.vault_task_queue)
    assert report.scope == scope
    return run_id


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = rememberer
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


async def test_a_scope_is_erased_whole_and_no_other_is_touched(client, settings,
                                                              database_url, fake_anthropic):
    gone, kept = f"erase-{uuid.uuid4().hex[:8]}", f"kept-{uuid.uuid4().hex[:8]}"
    folder: Path = settings.memory.vault_dir_for(gone)
    async with keel_worker(client, settings) as keel:
        session = await remembered(keel, gone, "the harbour code is 4471")
        other = await remembered(keel, kept, "the lighthouse code is 9902")
        assert (folder / CARD_FILE).is_file() and (folder / ".git").is_dir()
        assert set(scope_rows(database_url, gone)) >= {"memory_docs", "memory_terms",
                                                       "memory_stats", "vault_ops"}

        doctor = {s: await doctor_run(keel, s) for s in (gone, kept)}
        nightly = f"keel-memory-doctor-{uuid.uuid4().hex[:8]}"  # as its schedule starts it
        await keel.client.execute_workflow(
            MemoryNightlyWorkflow.run, NightlyInput(job=NightlyJob.DOCTOR), id=nightly,
            task_queue=settings.vault_task_queue)
        store = open_store(settings)
        for s in (gone, kept):  # the beat publishes CORE.md for the session workers
            await until(lambda s=s: shared_vault_text(store, s, CORE_FILE), within_s=20)
        before_kept = scope_rows(database_url, kept)

        # Running, it refuses, naming the session; nothing is erased.
        with pytest.raises(DeleteRefusedError) as refused:
            await keel.erase_memory_scope(gone)
        assert str(refused.value) == running_text(gone, [session.session_id])
        assert (folder / CARD_FILE).is_file() and scope_rows(database_url, gone)

        await session.end()
        done = await keel.erase_memory_scope(gone)
        assert done.found and done.folder == str(folder) and done.files > 3
        assert done.rows["memory_docs"] >= 3 and done.sessions_deleted == []
        assert done.runs == 2  # its doctor's runs (now, nightly): they name its card files
        assert done.copies == 2  # its CORE.md (memory) and schema.json, as published
        assert await shared_vault_text(store, gone, CORE_FILE) is None
        assert await shared_vault_text(store, kept, CORE_FILE) is not None
        await temporal_forgot(client, doctor[gone])
        await temporal_forgot(client, nightly_child_id(nightly, gone))
        assert not folder.exists()
        assert scope_rows(database_url, gone) == {}
        assert not await found(keel, gone, "the harbour code is 4471")
        # The other scope keeps its folder, its rows and its search.
        kept_folder = settings.memory.vault_dir_for(kept)
        assert (kept_folder / CARD_FILE).is_file()
        after_kept = scope_rows(database_url, kept)  # (its vectors are made on the beat)
        assert set(after_kept) >= set(before_kept)
        assert after_kept["memory_docs"] == before_kept["memory_docs"]
        assert await found(keel, kept, "the lighthouse code is 9902")
        for kept_run in (doctor[kept], nightly_child_id(nightly, kept), nightly):
            await client.get_workflow_handle(kept_run).describe()  # still there
        # The ended session keeps its record (keel delete takes it).
        assert db(database_url, "SELECT count(*) FROM messages WHERE session_id = %s",
                  session.session_id)[0][0] >= 6

        again = await keel.erase_memory_scope(gone)
        assert not again.found and again.rows == {} and again.folder is None
        assert not folder.exists()

        # The scope starts afresh: a new session's words make a new vault, and nothing
        # of the erased one is recalled.
        fresh = await keel.start_session(f"{gone}-fresh",
                                         config=session_config(settings, memory_scope=gone))
        sent = len(fake_anthropic.requests)
        await fresh.ask("what is the harbour code?")
        assert "harbour" in json.dumps(fake_anthropic.requests[sent:])
        assert "4471" not in json.dumps(fake_anthropic.requests[sent:])  # nothing recalled
        await transcribed(folder, fresh.session_id, 2)
        assert not (folder / CARD_FILE).exists()
        await fresh.end()
        await other.end()


async def test_with_its_sessions_a_running_scope_is_erased_and_they_are_deleted(
        client, settings, database_url):
    scope = f"tenant-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as keel:
        running = await remembered(keel, scope, "the tenant's own words")
        ended = await remembered(keel, scope, "the tenant's older words")
        await ended.end()
        # Started, no message yet: its row does not name the scope; its workflow does.
        idle = await keel.start_session(f"{scope}-idle",
                                        config=session_config(settings, memory_scope=scope))
        # A row the record wrote before the session's first model call named its scope (a
        # background input recorded first, a first call that failed): asked too.
        recorded = await keel.start_session(
            f"{scope}-recorded", config=session_config(settings, memory_scope=scope))
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("INSERT INTO sessions (session_id, user_name) VALUES (%s, 'user')",
                         (recorded.session_id,))
        with pytest.raises(DeleteRefusedError) as refused:
            await keel.erase_memory_scope(scope, with_sessions=True)  # not forced
        assert str(refused.value) == running_text(
            scope, sorted([running.session_id, idle.session_id, recorded.session_id]))
        assert db(database_url, "SELECT count(*) FROM sessions WHERE memory_scope = %s",
                  scope) == [(2,)]

        done = await keel.erase_memory_scope(scope, with_sessions=True, force=True)
        assert done.sessions_deleted == sorted([running.session_id, ended.session_id,
                                                idle.session_id, recorded.session_id])
        assert db(database_url, "SELECT count(*) FROM sessions WHERE memory_scope = %s",
                  scope) == [(0,)]
        assert scope_rows(database_url, scope) == {}
        assert not settings.memory.vault_dir_for(scope).exists()


async def test_keel_vault_erase_asks_once_more_and_says_what_went(client, settings,
                                                                  database_url, tmp_path):
    env = {"TEMPORAL_ADDRESS": client.service_client.config.target_host,
           "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": settings.task_queue,
           "KEEL_DATA_DIR": str(tmp_path), "COLUMNS": "200"}

    def keel(*args: str, code: int = 0) -> str:
        result = CliRunner().invoke(app, ["vault", "erase", *args], env=env)
        assert result.exit_code == code, (args, result.output, result.exception)
        return " ".join(result.output.split())

    scope = f"cli-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as kc:
        session = await remembered(kc, scope, "words for the command line")
        out = await asyncio.to_thread(keel, "--scope", scope, code=1)
        assert f"erasing memory scope '{scope}' cannot be undone: pass --yes" in out
        out = await asyncio.to_thread(keel, "--scope", scope, "--yes", code=1)
        assert f"memory scope '{scope}' is in use by 1 running session(s)" in out
        assert "nothing was erased" in out
        await session.end()
        out = await asyncio.to_thread(keel, "--scope", scope, "--yes")
        assert f"erased memory scope '{scope}': its vault folder" in out
        assert "with its git history" in out and "memory_docs" in out
        out = await asyncio.to_thread(keel, "--scope", scope, "--yes", code=1)
        assert f"no long memory of scope '{scope}' here" in out
        out = await asyncio.to_thread(keel, "--scope", "Not A Scope", "--yes", code=1)
        assert "is not a valid scope id" in out


async def test_the_beat_takes_no_erased_scope_back(settings, database_url):
    """The vault worker's beat lists the scopes, then takes each one's lock, which makes the
    folder for its lock file: a scope erased in between came back as a folder holding only
    that file (listed again by `keel vault list`). The beat drops it instead."""
    from activities.vault.context import MemoryContext, scope_vaults
    from activities.vault.turn import catch_up_hand_edits
    from schemas.vault.schema import LOCK_FILE

    ctx = MemoryContext(settings=settings, database_url=database_url)
    kept = ctx.scoped("kept").vault
    kept.ensure()
    erased = ctx.scoped("erased").vault
    erased.root.mkdir(parents=True)
    (erased.root / LOCK_FILE).touch()  # what the lock left of it
    assert set(scope_vaults(settings.memory)) >= {"kept", "erased"}
    await catch_up_hand_edits(ctx)
    assert not erased.root.exists() and (kept.root / CORE_FILE).is_file()
    assert "erased" not in scope_vaults(settings.memory)
