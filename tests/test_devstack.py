"""keel.devstack: a `keel dev` killed without its cleanup (SIGKILL, the OOM killer) leaves
its Temporal dev server running on the data folder; the next `keel dev` stops it, where it
refused to start ("already running"), leaving the person to find the process. A dev
server killed under a running `keel dev` is started again on its port and file, where the
workers polled a dead address until the person restarted `keel dev`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import psycopg
import pytest

from keel import devstack
from keel._errors import DataDirError
from keel.devstack import STACK_FILE, stop_orphaned_stack
from tests.fake_anthropic import text_message
from tests.harness import DevServer, keel_worker, make_settings


def _dev_server(data_dir: Path) -> subprocess.Popen[bytes]:
    """A dev server on the data folder's SQLite file, as `keel dev` starts it."""
    return DevServer((data_dir / "temporal.sqlite").resolve()).start()


def _stack_file(data_dir: Path, owner: int) -> None:
    (data_dir / STACK_FILE).write_text(json.dumps({
        "temporal_address": "127.0.0.1:1", "database_url": "postgresql://x",
        "pid": str(owner)}))


def test_the_dev_server_of_a_killed_keel_dev_is_stopped(tmp_path: Path) -> None:
    server = _dev_server(tmp_path)
    owner = subprocess.Popen([sys.executable, "-c", "pass"])
    owner.wait()  # the `keel dev` that wrote the stack file: gone
    _stack_file(tmp_path, owner.pid)
    (tmp_path / "elsewhere").mkdir()
    other = _dev_server(tmp_path / "elsewhere")  # another data folder's: left alone
    try:
        time.sleep(1)
        assert stop_orphaned_stack(tmp_path) == [server.pid]
        assert server.wait(15) is not None
        assert not (tmp_path / STACK_FILE).exists()
        assert other.poll() is None
        assert stop_orphaned_stack(tmp_path) == []  # nothing left
    finally:
        for proc in (server, other):
            proc.kill()
            proc.wait(15)


def test_a_running_keel_dev_is_left_alone(tmp_path: Path) -> None:
    server = _dev_server(tmp_path)
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    _stack_file(tmp_path, owner.pid)
    try:
        time.sleep(1)
        assert stop_orphaned_stack(tmp_path) == []
        assert server.poll() is None and (tmp_path / STACK_FILE).exists()
        assert psutil.pid_exists(owner.pid)
    finally:
        for proc in (server, owner):
            proc.kill()
            proc.wait(15)


async def test_a_dev_server_that_stops_is_started_again_and_the_session_goes_on(
        tmp_path: Path, database_url: str, fake_anthropic, monkeypatch) -> None:
    monkeypatch.setattr(devstack, "WATCH_S", 0.2)
    fake_anthropic.responder = lambda body: text_message("heard")
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with devstack.running_stack(settings) as stack, \
            keel_worker(stack.client, settings) as keel:
        session = await keel.start_session("survives-its-server")
        assert (await asyncio.wait_for(session.ask("first"), 60)).error is None
        first = _dev_server_pids(tmp_path)
        assert len(first) == 1
        os.kill(first[0], signal.SIGKILL)  # the OOM killer's way
        answer = await asyncio.wait_for(session.ask("second"), 120)
        assert answer.error is None
        again = _dev_server_pids(tmp_path)
        assert len(again) == 1 and again != first
        assert stack.temporal_address == stack.client.service_client.config.target_host
        with psycopg.connect(database_url) as conn:  # one session, both turns recorded
            users = conn.execute("SELECT content_text FROM messages WHERE session_id=%s AND"
                                 " type='user' ORDER BY seq", (session.session_id,)).fetchall()
        assert [t for (t,) in users] == ["first", "second"]
    assert _dev_server_pids(tmp_path) == []  # stopped with its block


def _dev_server_pids(data_dir: Path) -> list[int]:
    sqlite = str((data_dir / "temporal.sqlite").resolve())
    found = []
    for p in psutil.Process().children():
        try:  # a child that ends while it is looked at (a vault's git, say) is none
            if p.status() != psutil.STATUS_ZOMBIE and "start-dev" in p.cmdline() \
                    and any(sqlite in a for a in p.cmdline()):
                found.append(p.pid)
        except psutil.NoSuchProcess:
            continue
    return found


async def test_an_embedded_postgres_that_stops_is_started_again_with_its_data(
        monkeypatch) -> None:
    monkeypatch.setattr(devstack, "WATCH_S", 0.2)
    with devstack.temporary_postgres("keel-pg-watch-") as url:
        data_dir = Path(url.split("host=", 1)[1]).parent
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (note text)")
            conn.execute("INSERT INTO kept VALUES ('written before the crash')")
        server = devstack.EmbeddedPostgres(data_dir)
        first = server.pid
        assert first is not None and server.alive()
        keeping = asyncio.create_task(devstack.keep_running([server]))
        try:
            os.kill(first, signal.SIGKILL)  # the postmaster: its backends follow it
            for _ in range(300):
                await asyncio.sleep(0.1)
                if server.pid != first and server.alive():
                    break
            assert server.pid != first and server.alive()
            with psycopg.connect(url) as conn:
                rows = conn.execute("SELECT note FROM kept").fetchall()
            assert rows == [("written before the crash",)]
        finally:
            keeping.cancel()
            await asyncio.wait({keeping})


def test_a_temporary_postgres_left_by_a_killed_process_is_stopped_and_removed() -> None:
    """A run killed by a signal never reaches its block's end: its server ran on and its
    folder stayed (four found in /tmp after one day's work, 72 MB and more each). The
    next block of the same prefix stops the server and removes the folder; a live
    owner's is left alone."""
    import tempfile

    prefix = "keel-pg-sweep-"
    code = ("import time; from keel.devstack import temporary_postgres\n"
            f"block = temporary_postgres({prefix!r}); print(block.__enter__(), flush=True)\n"
            "time.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).parent.parent)
    assert child.stdout is not None
    url = child.stdout.readline().strip()
    [left] = [f for f in Path(tempfile.gettempdir()).glob(f"{prefix}*")
              if (f / devstack.OWNER_FILE).read_text() == str(child.pid)]
    with devstack.temporary_postgres(prefix) as live_url:  # its owner lives: left alone
        assert left.exists()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT 1")
        child.kill()
        child.wait()
        with psycopg.connect(url, autocommit=True) as conn:  # it runs on, owner gone
            conn.execute("SELECT 1")
        with devstack.temporary_postgres(prefix):
            assert not left.exists()
            try:
                psycopg.connect(url, connect_timeout=3).close()
                raise AssertionError("the left server still answers")
            except psycopg.OperationalError:
                pass
        with psycopg.connect(live_url, autocommit=True) as conn:  # this process's: runs
            conn.execute("SELECT 1")


def test_a_data_folder_with_a_space_or_a_quote_in_its_path_runs_postgres() -> None:
    # pg_ctl hands the socket's folder (the data folder, when short) to /bin/sh unquoted: a
    # project folder such as "My Projects", holding the default .keel, stopped PostgreSQL
    # from starting ("Syntax error: Unterminated quoted string" for a quote).
    with devstack.temporary_postgres("keel-pg-my dir's-") as url:
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_data_folder_pg_ctl_cannot_take_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(DataDirError, match="holds '\"', which PostgreSQL's pg_ctl cannot"):
        devstack.start_embedded_postgres(tmp_path / 'a"b')
    assert not (tmp_path / 'a"b').exists()  # nothing made
