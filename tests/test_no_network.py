"""Nothing reaches the network at run time but the model API and the servers a user
configured: `keel demo` on the embedded default (its PostgreSQL and Temporal dev server,
Keel's worker, long memory with the built-in embedder, the tokenizer's encoding from an
installed package), its Python process watched by an audit hook that writes down every
socket connection and name lookup, connects to loopback and Unix sockets only.

The embedded servers are processes of their own (Go and C): the hook sees only how Keel's
process reaches them, not what they do. With no API key there is no model API to reach.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HOOK = r'''
import ipaddress, json, os, sys

log = open(os.environ["KEEL_NET_LOG"], "a", buffering=1)


def local(host):
    if host is None or host in ("localhost", ""):
        return True
    try:
        address = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return False  # a name to look up: the network
    return address.is_loopback or address.is_unspecified


def hook(event, args):
    if event == "socket.connect":
        address = args[1]
        if isinstance(address, tuple) and not local(address[0]):
            log.write(json.dumps([event, str(address)]) + "\n")
    elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.sendto"):
        host = args[0] if event != "socket.sendto" else args[1]
        if isinstance(host, tuple):
            host = host[0]
        if not local(host):
            log.write(json.dumps([event, str(host)]) + "\n")


sys.addaudithook(hook)
'''


def _watched(tmp_path: Path, code: str) -> tuple[subprocess.CompletedProcess[str],
                                                 list[list[str]]]:
    """`code` run in a fresh Python process under the hook: how it ended, and what it
    reached beyond loopback."""
    log = tmp_path / "net.jsonl"
    env = {k: v for k, v in os.environ.items()
           if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "TEMPORAL_ADDRESS",
                        "DATABASE_URL", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(KEEL_DATA_DIR=str(tmp_path / "data"), KEEL_NET_LOG=str(log), COLUMNS="120")
    done = subprocess.run([sys.executable, "-c", HOOK + code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    reached = [json.loads(line) for line in log.read_text().splitlines()] \
        if log.exists() else []
    return done, reached


def test_the_watch_sees_a_lookup_and_a_connection(tmp_path: Path) -> None:
    """The instrument is not blind: a name lookup and a connection beyond loopback are
    written down (neither needs to succeed)."""
    done, reached = _watched(tmp_path, (
        "import socket\n"
        "for call in (lambda: socket.getaddrinfo('model-api.example', 443),\n"
        "             lambda: socket.create_connection(('192.0.2.1', 443), timeout=0.01)):\n"
        "    try:\n"
        "        call()\n"
        "    except OSError:\n"
        "        pass\n"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert ["socket.getaddrinfo", "model-api.example"] in reached
    assert ["socket.connect", "('192.0.2.1', 443)"] in reached


def test_the_offline_demo_reaches_nothing_but_loopback(tmp_path: Path) -> None:
    done, reached = _watched(tmp_path, "from keel.cli import app\n"
                                       "app(['demo', '--turns', '12'])\n")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "checkpoints:" in done.stdout  # the demo ran to its summary
    assert reached == [], reached
