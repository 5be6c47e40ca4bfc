"""What the MCP tests share: the real servers' paths, specs for them, the docs server over
streamable HTTP on loopback, which of their processes this test process started, and a
session's tool results as the record holds them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from schemas.mcp import McpServerSpec
from tests.harness import stop_process

SERVERS = Path(__file__).parent / "servers"
DOCS = str(Path(__file__).resolve().parents[2] / "examples" / "support" / "docs_server.py")
BAD = str(SERVERS / "bad_server.py")
POOL = str(SERVERS / "pool_server.py")
IMAGES = str(SERVERS / "image_server.py")
WIDE = str(SERVERS / "wide_server.py")
HTTP_KEY = "docs-key-7f3a9c1e55"  # what the HTTP server demands in X-Docs-Key


def stdio_spec(script: str = DOCS, *, name: str = "docs", args: tuple[str, ...] = (),
               env_names: tuple[str, ...] = (), **fields: object) -> McpServerSpec:
    """`fields` override these timeouts or set any other field of the spec. A listing
    that answers gets the product's bound (`list_s` 15 s: a 200-tool listing took over 5 s
    on a loaded 2-core machine); a test of a hang sets its own."""
    return McpServerSpec.model_validate({
        "name": name, "stdio": {"command": sys.executable, "args": [script, *args],
                                "env_names": list(env_names)},
        "connect_s": 10, "list_s": 15, "call_s": 5, **fields})


def http_spec(url: str, header_env: dict[str, str] | None = None,
              **fields: object) -> McpServerSpec:
    return McpServerSpec.model_validate({
        "name": "web", "http": {"url": url, "header_env": header_env or {}},
        "connect_s": 5, "list_s": 15, "call_s": 5, **fields})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def docs_http_url(tmp_path_factory) -> Iterator[str]:
    """docs_server.py over streamable HTTP on a free loopback port, demanding HTTP_KEY."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("docs-http") / "stderr.log"
    log = log_path.open("wb")  # a file, not a pipe: the server's logs can never block it
    proc = subprocess.Popen([sys.executable, DOCS, "--http", str(port)],
                            env={**os.environ, "DOCS_REQUIRED_KEY": HTTP_KEY},
                            stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            log.close()
            raise RuntimeError(f"docs server exited: {log_path.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("docs server did not listen within 20 s") from None
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    stop_process(proc)
    log.close()


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv("KEEL_TEST_DOCS_KEY", HTTP_KEY)


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state


def _descends_from_us(pid: int) -> bool:
    """Whether `pid` was started by this test process (tests in other processes, run
    beside this one, start servers of their own)."""
    ours = os.getpid()
    while pid > 1:
        if pid == ours:
            return True
        pid = _parent(pid)
    return False


def server_pids(script: str) -> list[int]:
    """Live (not zombie) processes running `script` that this process started."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if (proc.name.isdigit() and script.encode() in (proc / "cmdline").read_bytes()
                    and _descends_from_us(int(proc.name))):
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    pids.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def bad_server_pids() -> list[int]:
    return server_pids(BAD)


def results(database_url: str, session_id: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """A session's tool results by call id: (text, content) as the record holds them."""
    with psycopg.connect(database_url) as conn:
        found = conn.execute(
            "SELECT content_text, content FROM messages WHERE session_id=%s"
            " AND type='tool_result' ORDER BY seq", (session_id,)).fetchall()
    return {content["tool_use_id"]: (text, content) for text, content in found}
