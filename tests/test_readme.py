"""The README's snippets run as written: its Python blocks as a user runs them (against a
stack `keel dev` would have started: the stack file in the data folder, a worker serving
the default queue, the offline model), its TOML blocks load as the agent specs
`keel start --agent` reads, every `keel` command line it shows names a command that exists
with options that command takes, and every script line a script with its options. A
renamed option or a changed signature fails here, not in a reader's shell. (The first
block's two set-up commands are what CI and a fresh clone run.)"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from keel.cli import app
from keel.devstack import STACK_FILE
from schemas.agent import spec_from_text
from schemas.config import KeelSettings
from tests.harness import keel_worker, make_settings

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, ROOT / "infra" / "README.md", ROOT / "bench" / "README.md"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(language: str, docs: list[Path] | None = None) -> list[str]:
    """The fenced blocks of one language of the README (or of `docs`), in order."""
    return [body for doc in docs or [README]
            for lang, body in FENCE.findall(doc.read_text()) if lang == language]


def shell_lines(*programs: str) -> list[str]:
    """Every line of the shell blocks of the README, infra/ and bench/ that runs one of
    `programs`, its comment cut off."""
    lines = []
    for body in blocks("bash", DOCS):
        for line in body.splitlines():
            words = line.split(" #", 1)[0].strip()
            if words.split(" ", 1)[0] in programs:
                lines.append(words)
    return lines


def keel_lines() -> list[str]:
    return shell_lines(".venv/bin/keel", "keel")


def resolve(words: list[str]) -> tuple[Any, list[str]]:
    """The command a line's words name (through its groups) and the words left after it
    (typer's own click objects: a group has `commands`)."""
    command = typer.main.get_command(app)
    while words and words[0] in getattr(command, "commands", {}):
        command, words = command.commands[words[0]], words[1:]  # type: ignore[attr-defined]
    return command, words


def test_the_readme_has_the_blocks_this_test_reads() -> None:
    assert len(blocks("python")) >= 3 and len(blocks("toml")) >= 2
    assert len(keel_lines()) >= 35 and len(shell_lines(".venv/bin/python")) >= 20


@pytest.mark.parametrize("line", keel_lines())
def test_every_keel_command_line_names_a_command_and_its_options(line: str) -> None:
    command, rest = resolve(shlex.split(line)[1:])
    assert not hasattr(command, "commands"), f"{line}: no such command"
    known = {opt for param in command.params for opt in param.opts + param.secondary_opts}
    used = {word.split("=", 1)[0] for word in rest
            if word.startswith("-") and word != "-"}  # - alone: standard input
    assert used <= known, f"{line}: {sorted(used - known)} not options of the command"


@pytest.mark.parametrize("line", shell_lines(".venv/bin/python"))
def test_every_script_line_names_a_script_and_its_options(line: str) -> None:
    script, *rest = shlex.split(line)[1:]
    source = (ROOT / script).read_text()  # FileNotFoundError: no such script
    for word in rest:
        if word.startswith("--"):
            assert f'"{word}"' in source, f"{line}: {word} is not an option of {script}"


@pytest.mark.parametrize("text", blocks("toml"))
def test_every_toml_block_is_an_agent_spec(text: str) -> None:
    spec = spec_from_text(text, ".toml")
    assert spec.model_dump(exclude_defaults=True)  # it says something


def test_the_python_blocks_without_a_stack_run(tmp_path: Path) -> None:
    for body in blocks("python"):
        if "KeelClient" in body:
            continue  # needs the stack: below
        done = subprocess.run([sys.executable, "-c", body], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr


async def test_the_client_blocks_run_against_a_stack_keel_dev_started(
        client, database_url, tmp_path: Path) -> None:
    """`keel dev` writes the stack file the snippets read; here it names the test's dev
    server and database, and a worker serves the queue their settings name."""
    settings: KeelSettings = make_settings(database_url, tmp_path)  # the offline model
    (tmp_path / STACK_FILE).write_text(json.dumps({
        "temporal_address": client.service_client.config.target_host,
        "database_url": database_url}))
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("KEEL_", "TEMPORAL_", "ANTHROPIC_", "DATABASE_URL"))}
    env.update(KEEL_DATA_DIR=str(tmp_path), KEEL_TASK_QUEUE=settings.task_queue)
    snippets = [body for body in blocks("python") if "KeelClient" in body]
    assert len(snippets) >= 2
    async with keel_worker(client, settings):
        for body in snippets:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", body, cwd=ROOT, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 180)
            assert proc.returncode == 0, err.decode()[-3000:]
            assert out.strip(), body  # each prints what it did
