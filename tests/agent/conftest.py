"""Fixtures for agent-spec tests: the service's tools in a real second worker process on
its own task queue, and the docs MCP server over stdio or streamable HTTP on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas.mcp import McpHttp, McpServerSpec
from tests.harness import stop_process

ROOT = Path(__file__).resolve().parents[2]
SERVERS = ROOT / "tests" / "mcp" / "servers"
DOCS = str(ROOT / "examples" / "support" / "docs_server.py")  # the example's own server
BAD = str(SERVERS / "bad_server.py")


def docs_stdio(name: str = "docs", script: str = DOCS, **timeouts: float) -> McpServerSpec:
    return McpServerSpec.model_validate({
        "name": name, "stdio": {"command": sys.executable, "args": [script]},
        "connect_s": 10, "list_s": 10, "call_s": 5, **timeouts})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_line(proc: subprocess.Popen, log: Path, needle: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while needle not in log.read_text():
        if proc.poll() is not None:
            raise RuntimeError(f"process exited: {log.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"no {needle!r} within {seconds} s: {log.read_text()}")
        time.sleep(0.1)


@pytest.fixture
def service_queue(client, tmp_path) -> Iterator[tuple[str, Path]]:
    """The service's worker as its own process; yields its task queue and refund log."""
    queue = f"support-tools-{uuid.uuid4().hex[:8]}"
    refunds = tmp_path / "refunds.jsonl"
    log = tmp_path / "service.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.agent.service_worker",
             client.service_client.config.target_host, queue],
            cwd=ROOT, env={**os.environ, "REFUND_LOG": str(refunds)},
            stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_line(proc, log, "service worker ready", 30)
            yield queue, refunds
        finally:
            stop_process(proc)


@pytest.fixture(scope="module")
def docs_http() -> Iterator[McpServerSpec]:
    """docs_server.py over streamable HTTP on a free loopback port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, DOCS, "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("docs server did not listen") from None
            time.sleep(0.1)
    yield McpServerSpec(name="webdocs", http=McpHttp(url=f"http://127.0.0.1:{port}/mcp"),
                        connect_s=5, list_s=5, call_s=5)
    stop_process(proc)
