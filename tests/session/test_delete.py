"""Deleting a session end to end, through a real worker, PostgreSQL and Temporal: what it
owns is gone from every table, folder, schedule and history; what is not its own (a session
whose id starts with its id) keeps everything; its id names a new session afterwards; a
running one only when told to stop it; `keel delete` asks once more."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from temporalio.client import Client
from typer.testing import CliRunner

from activities.wakeups import wakeup_schedule_id
from keel.cli import app
from keel.client import DeleteRefusedError, KeelClient, SessionHandle, session_config
from schemas.agent import AgentSpec
from schemas.config import WorkspaceStoreKind
from schemas.initiative import WakeupLimits
from schemas.vault.rollup import split_transcript
from tests.checkpoint_model import CheckpointModel, good_checkpoint, texts
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.session.branching import answer as branch_answer
from tests.session.branching import db
from tests.session.deletion import left_behind, temporal_forgot
from tests.session.long_memory import CARD_FILE, entries, rememberer, transcribed
from tests.session.other_stack import other_temporal  # noqa: F401
from workers.worker import Role

AGENT = AgentSpec(instructions="You keep notes.",
                  wakeups=WakeupLimits(min_interval_s=1, max_active=3, expiry_s=86_400))


def answer(body: dict[str, Any]) -> dict[str, Any]:
    """test_branch's turns ("write X" writes notes.txt), and "wake me" makes an hourly
    wakeup."""
    if texts(body["messages"][-1])[-1:] == ["wake me"]:
        return tool_use_message([("schedule_wakeup", {"note": "look again",
                                                      "every_s": 3600})])
    return branch_answer(body)


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = CheckpointModel(good_checkpoint, ordinary=answer)
    base = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    return base.model_copy(update={"workspace_store": WorkspaceStoreKind.POSTGRES})


async def lived(keel: KeelClient, session_id: str) -> SessionHandle:
    """A session with rows, a checkpoint, a workspace file and a recurring wakeup."""
    session = await keel.start_session(session_id, agent=AGENT)
    await session.ask("write one")
    await session.ask("wake me")
    await session.checkpoint_now()
    await session.ask("write two")
    return session


def durable(counts: dict[str, int]) -> dict[str, int]:
    return {name: n for name, n in counts.items() if not name.startswith("transcript_outbox")}


async def schedules(client: Client, session_id: str) -> list[str]:
    prefix = wakeup_schedule_id(session_id, "")
    return [s.id async for s in await client.list_schedules()
            if s.id.startswith(prefix) and "-" not in s.id[len(prefix):]]


async def test_a_deleted_session_leaves_nothing_and_its_id_is_free(
        client, settings, fake_anthropic, database_url):
    sid = f"del-{uuid.uuid4().hex[:8]}"
    sibling = f"{sid}-b"  # starts with the deleted id: none of it may go
    async with keel_worker(client, settings) as keel:
        session = await lived(keel, sid)
        await lived(keel, sibling)
        kept = left_behind(database_url, sibling)
        assert kept["messages.session_id"] and kept["checkpoints.session_id"]
        assert kept["workspace_files.scope"] and await schedules(client, sibling)
        with pytest.raises(DeleteRefusedError, match=f"{sid} is running: end it first"):
            await keel.delete_session(sid)
        assert left_behind(database_url, sid)["messages.session_id"] == 13  # nothing went
        await session.end()
        await session.handle.result()  # its last notice written
        owned = left_behind(database_url, sid)

        done = await keel.delete_session(sid)
        # Its files are notes.txt and the checkpoint's own; ended, it had deleted its
        # wakeup's schedule itself.
        assert (done.terminated, done.checkpoints, done.files, done.schedules) == \
            (False, 1, owned["workspace_files.scope"], 0)
        assert done.rows == owned["messages.session_id"] and done.runs >= 1
        assert left_behind(database_url, sid) == {}
        assert await schedules(client, sid) == []
        await temporal_forgot(client, sid)
        assert await keel.histories(sid) == []
        # What is not its own is all there (but the vault's queue, which drains).
        assert durable(left_behind(database_url, sibling)) == durable(kept)
        assert await schedules(client, sibling)
        assert (await keel.session(sibling).read_file("notes.txt")).data == b"two"
        with pytest.raises(DeleteRefusedError, match=f"no session {sid} in this"):
            await keel.delete_session(sid)

        # The id names a new session, which starts from nothing.
        fresh = await keel.start_session(sid, agent=AGENT)
        await fresh.ask("hello again")
        request = next(r for r in fake_anthropic.requests
                       if texts(r["messages"][-1])[-1:] == ["hello again"])
        assert "write one" not in str(request["messages"])
        assert await fresh.read_file("notes.txt") is None
        assert [r[0] for r in db(database_url, "SELECT type FROM messages WHERE "
                                 "session_id = %s ORDER BY seq", sid)] == ["user", "assistant"]
        with pytest.raises(DeleteRefusedError, match="may not start with '_'"):
            await keel.delete_session("_shared", force=True)
        # Running: only when told to stop it; stopped so, it leaves its schedules to us.
        await fresh.ask("wake me")
        assert await schedules(client, sid)
        done = await keel.delete_session(sid, force=True)
        assert (done.terminated, done.rows, done.schedules) == (True, 6, 1)
        assert await schedules(client, sid) == []
        assert left_behind(database_url, sid) == {}
        await temporal_forgot(client, sid)
        await keel.delete_session(sibling, force=True)
        assert left_behind(database_url, sibling) == {}


async def test_keel_delete_asks_once_more_and_says_what_went(
        client, database_url, fake_anthropic, tmp_path):
    # The default local workspace store: the session's folder goes too.
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    fake_anthropic.responder = answer
    env = {"TEMPORAL_ADDRESS": client.service_client.config.target_host,
           "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": settings.task_queue,
           "KEEL_DATA_DIR": str(tmp_path), "COLUMNS": "200"}

    def keel(*args: str, code: int = 0) -> str:
        result = CliRunner().invoke(app, list(args), env=env)
        assert result.exit_code == code, (args, result.output, result.exception)
        return " ".join(result.output.split())

    sid = f"cli-del-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as kc:
        session = await kc.start_session(sid)
        await session.ask("write one")
        assert (await session.read_file("notes.txt")) is not None
        await transcribed(tmp_path / "vault", sid, 4)  # its words in long memory
        from activities.workspace import LocalStore, open_store

        store = open_store(settings, pooled=False)
        assert isinstance(store, LocalStore) and store.folder(sid).is_dir()
        out = await asyncio.to_thread(keel, "delete", sid, code=1)
        assert "cannot be undone: pass --yes" in out
        out = await asyncio.to_thread(keel, "delete", sid, "--yes", code=1)
        assert f"{sid} is running: end it first (keel end {sid})" in out
        assert left_behind(database_url, sid)  # refused twice: nothing went
        out = await asyncio.to_thread(keel, "delete", sid, "--yes", "--force")
        assert (f"deleted session {sid} (it was running: stopped first): 4 row(s), "
                "0 checkpoint(s), 1 workspace file(s), 0 wakeup schedule(s), 1 workflow "
                "run(s)") in out
        assert ("long memory (scope default): 2 daily-note entries taken out; its cards and "
                "rollups stay") in out
        assert not store.folder(sid).exists()
        assert left_behind(database_url, sid) == {}
        await temporal_forgot(client, sid)
        out = await asyncio.to_thread(keel, "delete", sid, "--yes", code=1)
        assert f"no session {sid} in this deployment" in out


async def test_its_words_leave_long_memory_its_cards_stay_and_its_id_starts_afresh(
        client, database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = rememberer
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    vault = tmp_path / "vault"
    sid = f"mem-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(sid)
        await session.ask("remember Dana")  # a card; #1 to #4
        await session.ask("the words of the first")  # #5, #6
        await transcribed(vault, sid, 6)
        sibling = await keel.start_session(f"{sid}-b")
        await sibling.ask("the words of another")
        await transcribed(vault, f"{sid}-b", 2)
        card = (vault / CARD_FILE).read_bytes()
        before = entries(vault, f"{sid}-b")
        theirs = [f.read_text() for f in (vault / "daily").glob("*.md")]
        mine = entries(vault, sid)
        assert mine >= 4

        await session.end()
        done = await keel.delete_session(sid)
        assert (done.memory_scope, done.entries, done.unreadable) == ("default", mine, [])
        days = [f.read_text() for f in (vault / "daily").glob("*.md")]
        assert entries(vault, sid) == 0 and "the words of the first" not in "".join(days)
        assert entries(vault, f"{sid}-b") == before and "the words of another" in days[0]
        assert [s for s, _, _ in split_transcript("".join(days))] == \
            [s for s, _, _ in split_transcript("".join(theirs)) if s != sid]
        assert db(database_url, "SELECT count(*) FROM memory_docs WHERE session_id = %s",
                  sid) == [(0,)]
        assert (vault / CARD_FILE).read_bytes() == card  # the scope's knowledge stays

        # The same day, a new session under the id: its words are transcribed (before,
        # the old entries' markers said its seqs were written already).
        await temporal_forgot(client, sid)
        fresh = await keel.start_session(sid)
        await fresh.ask("the words of the second")
        await transcribed(vault, sid, 2)
        days = "".join(f.read_text() for f in (vault / "daily").glob("*.md"))
        assert next(t for s, _, t in split_transcript(days) if s == sid).endswith(
            "the words of the second")
        await keel.delete_session(f"{sid}-b", force=True)
        await keel.delete_session(sid, force=True)


async def test_without_a_vault_worker_nothing_is_deleted_and_it_says_why(
        client, database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = answer
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    sid = f"novault-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings, role=Role.SESSIONS) as keel:
        session = await keel.start_session(sid)
        await session.ask("hello")  # answered; its long memory cannot be reached
        owned = left_behind(database_url, sid)
        started = time.monotonic()
        with pytest.raises(DeleteRefusedError, match=(
                "long memory \\(scope default\\) has no vault worker: none polled "
                f"{settings.task_queue}-vault lately")):
            await keel.delete_session(sid, force=True)
        assert time.monotonic() - started < 10  # said at once, not after a long wait
        assert left_behind(database_url, sid) == owned
        assert (await session.status()).turn == 1  # not even stopped
        assert await session.is_running()


async def test_a_retention_sweep_deletes_what_ended_before_a_time_and_nothing_else(
        other_temporal, database_url, fake_anthropic, tmp_path):  # noqa: F811
    # Its own namespace: the sweep sees this test's sessions only.
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    fake_anthropic.responder = answer
    env = {"TEMPORAL_ADDRESS": other_temporal.service_client.config.target_host,
           "TEMPORAL_NAMESPACE": other_temporal.namespace, "DATABASE_URL": database_url,
           "KEEL_TASK_QUEUE": settings.task_queue, "KEEL_DATA_DIR": str(tmp_path),
           "COLUMNS": "300"}

    def keel(*args: str, code: int = 0) -> str:
        result = CliRunner().invoke(app, list(args), env=env)
        assert result.exit_code == code, (args, result.output, result.exception)
        return " ".join(result.output.split())

    tag = uuid.uuid4().hex[:6]
    async with keel_worker(other_temporal, settings) as kc:
        async def ended(name: str) -> str:
            session = await kc.start_session(f"{name}-{tag}")
            await session.ask("write one")
            await session.end()
            await session.handle.result()
            return session.session_id

        old = [await ended("old-a"), await ended("old-b")]
        await asyncio.sleep(1.1)  # the cut is given to the second
        cut = datetime.now(UTC)
        await asyncio.sleep(1.1)
        late = await ended("late")
        running = await kc.start_session(f"running-{tag}")
        await running.ask("still here")
        for _ in range(100):  # visibility takes a moment to list a close
            if len(await kc.sessions_ended_before(datetime.now(UTC))) == 3:
                break
            await asyncio.sleep(0.1)
        assert await kc.sessions_ended_before(cut) == old  # oldest first
        out = await asyncio.to_thread(keel, "delete", "--ended-before", "2000-01-01",
                                      "--yes")
        assert "no session ended before 2000-01-01T00:00:00+00:00" in out
        out = await asyncio.to_thread(keel, "delete", "--ended-before",
                                      cut.isoformat(timespec="seconds"), "--yes")
        assert all(f"deleted session {sid}:" in out for sid in old), out
        assert late not in out and running.session_id not in out
        assert all(left_behind(database_url, sid) == {} for sid in old)
        assert left_behind(database_url, late) and await running.is_running()
        # A list with one refused: the others go, the refusal is said, exit 1.
        out = await asyncio.to_thread(keel, "delete", running.session_id, late, "--yes",
                                      code=1)
        assert f"deleted session {late}:" in out
        assert f"{running.session_id}: session {running.session_id} is running" in out
        assert "1 of 2 sessions not deleted" in out


async def test_its_sub_agents_are_named_as_kept_or_deleted_first_when_asked(
        client, database_url, fake_anthropic, tmp_path):
    from tests.session.teams import spec, team

    fake_anthropic.responder = team(lambda body: text_message("the answer is 42"))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    tag = uuid.uuid4().hex[:6]
    async with keel_worker(client, settings) as keel:
        async def delegating(name: str) -> tuple[str, str]:
            # No long memory: the first parent's words recalled would read as its answer.
            parent = await keel.start_session(f"{name}-{tag}", agent=spec(), config=(
                session_config(settings, memory_scope=None)))
            await parent.ask("find the answer")
            [child] = (await parent.status()).children
            await parent.end()
            await parent.handle.result()
            return parent.session_id, child.session_id

        parent, child = await delegating("keeps")
        done = await keel.delete_session(parent)
        assert done.sub_agents == [child] and done.sub_agents_deleted == []
        assert f"kept: its sub-agents' sessions {child}" in done.summary()[-1]
        assert left_behind(database_url, child)  # a session of its own: kept

        parent, child = await delegating("takes")
        done = await keel.delete_session(parent, sub_agents=True)
        assert [c.session_id for c in done.sub_agents_deleted] == [child]
        assert done.sub_agents == []  # none left to name
        assert done.summary()[0].startswith(f"deleted session {child}:")
        assert left_behind(database_url, child) == {} == left_behind(database_url, parent)
        await temporal_forgot(client, child)


@pytest.mark.parametrize("shape", ["it's-{}", 'say"{}', '"{}'])
async def test_a_session_id_holding_a_quote_is_replayed_and_deleted(
        client, settings, database_url, shape):
    # Temporal's visibility query took a single quote for the string's end ("malformed SQL
    # query"), and the dev server's visibility finds no id holding a double quote: `keel
    # replay` of such a session failed. A neighbour whose id starts as its does (what the
    # query for a double-quoted id also lists) is neither replayed nor deleted with it.
    tag = uuid.uuid4().hex[:8]
    sid = shape.format(tag)
    neighbour = f"{sid.split(chr(34))[0]}n-{tag}"
    async with keel_worker(client, settings) as keel:
        for each in (sid, neighbour):
            session = await keel.start_session(each, config=session_config(
                settings, memory_scope=None))
            await session.ask("write one")
            await session.end()
            await session.handle.result()
        for _ in range(50):  # visibility takes a moment to list the run
            if await keel.histories(sid) and await keel.histories(neighbour):
                break
            await asyncio.sleep(0.1)
        assert [h.workflow_id for h in await keel.histories(sid)] == [sid]
        done = await keel.delete_session(sid)
        assert done.runs == 1 and left_behind(database_url, sid) == {}
        await temporal_forgot(client, sid)
        assert [h.workflow_id for h in await keel.histories(neighbour)] == [neighbour]
        assert left_behind(database_url, neighbour)
        await keel.delete_session(neighbour)


async def test_its_files_uploads_and_downloads_go_with_it(client, settings):
    """A file put and read in parts leaves the bytes in its upload's and download's
    histories: they go with the session, a running upload stopped first; a session whose
    id starts with its id keeps its own."""
    from schemas.uploads import (
        UPLOAD_PART_BYTES,
        UPLOAD_WORKFLOW,
        UploadPart,
        UploadStart,
        upload_workflow_id,
    )

    big = bytes(range(256)) * (UPLOAD_PART_BYTES // 128)  # two parts
    sid = f"del-up-{uuid.uuid4().hex[:8]}"

    async def transfers(session_id: str) -> list[str]:
        return sorted([w.id async for w in client.list_workflows(
            f"WorkflowId STARTS_WITH '{session_id}.'")])

    async with keel_worker(client, settings) as keel:
        sessions = [await keel.start_session(s) for s in (sid, f"{sid}-b")]
        for session in sessions:
            await session.put_file("big.bin", big)
            assert (await session.read_file("big.bin")).data == big
        left = uuid.uuid4().hex  # an upload its client left running
        running = await client.start_workflow(
            UPLOAD_WORKFLOW, UploadStart(session_id=sid, upload_id=left),
            id=upload_workflow_id(sid, left), task_queue=settings.task_queue)
        await running.execute_update("part", UploadPart(index=0, data=b"half"))
        assert len(await transfers(sid)) == 3 and len(await transfers(f"{sid}-b")) == 2
        done = await keel.delete_session(sid, force=True)
        assert done.runs >= 4  # its own run and the three transfers
        for _ in range(100):  # visibility lists a deleted run a moment longer
            if not await transfers(sid):
                break
            await asyncio.sleep(0.1)
        assert await transfers(sid) == []
        assert len(await transfers(f"{sid}-b")) == 2
        assert (await keel.session(f"{sid}-b").read_file("big.bin")).data == big
        await keel.delete_session(f"{sid}-b", force=True)
