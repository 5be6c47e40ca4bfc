"""The `keel` command as a person at a shell runs it, for the tests of the command line and
of the chat: the environment that reaches the test stack (`cli_env`), a command run in a
thread (`keel`, `invoke`), and `keel chat` on a pseudo-terminal (`Pty`, `keel_chat`)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from keel.cli import app


@pytest.fixture
def cli_env(client, settings, database_url, tmp_path):
    """The environment a shell user would set to reach this stack."""
    return {
        "TEMPORAL_ADDRESS": client.service_client.config.target_host,
        "DATABASE_URL": database_url,
        "KEEL_TASK_QUEUE": settings.task_queue,
        "KEEL_DATA_DIR": str(tmp_path),
        "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_BASE_URL": "",
        "COLUMNS": "200",  # no wrapping inside the lines the tests look for
    }


def invoke(env: dict[str, str], *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(app, list(args), env=env, input=input)


async def keel(env: dict[str, str], *args: str, input: str | None = None,
               code: int = 0) -> str:
    result = await asyncio.to_thread(invoke, env, *args, input=input)
    assert result.exit_code == code, (args, result.exit_code, result.output, result.exception)
    return result.output


class Pty:
    """A command on a pseudo-terminal, read as a person would see it."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        import pty

        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the command
            os.execve(argv[0], argv, env)
        self.seen = ""

    async def expect(self, text: str, timeout: float = 60, since: int = 0) -> str:
        """The screen once `text` shows on it after position `since`."""
        import re as _re

        deadline = time.monotonic() + timeout
        while True:
            plain = _re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", self.seen)
            if text in plain[since:]:
                return plain
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not seen; the screen:\n{plain}")
            try:
                chunk = await asyncio.to_thread(_read_some, self.fd)
            except OSError:
                chunk = b""
            self.seen += chunk.decode(errors="replace")

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def close(self) -> None:
        with __import__("contextlib").suppress(ProcessLookupError, ChildProcessError):
            os.kill(self.pid, signal.SIGTERM)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


def _read_some(fd: int) -> bytes:
    import select

    ready, _, _ = select.select([fd], [], [], 0.5)
    return os.read(fd, 4096) if ready else b""


def keel_chat(cli_env: dict[str, str], sid: str) -> Pty:
    """`keel chat SID` on a pseudo-terminal."""
    return Pty([str(Path(sys.executable).parent / "keel"), "chat", sid],
               {**os.environ, **cli_env, "TERM": "xterm"})
