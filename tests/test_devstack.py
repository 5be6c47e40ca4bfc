"""keel.devstack: a `keel dev` killed without its cleanup (SIGKILL, the OOM killer) leaves
its Temporal dev server running on the data folder; the next `keel dev` stops it, where it
refused to start ("already running"), leaving the person to find the process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil

from keel.devstack import STACK_FILE, stop_orphaned_stack
from tests.harness import DevServer


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
