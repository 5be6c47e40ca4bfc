"""`keel start` and `keel chat` give a new session the memory scope a person names
(`--memory-scope`), or none (`--no-memory`): the session's record names it, its words reach
that scope's vault only, and a chat's /new keeps it; a scope id that cannot be one, or both
options, are refused before anything starts."""

from __future__ import annotations

import uuid

import pytest

from tests.command_line import cli_env, keel  # noqa: F401 (a fixture)
from tests.harness import keel_worker, make_settings, until
from tests.session.branching import db


@pytest.fixture
def settings(database_url, tmp_path):
    return make_settings(database_url, tmp_path)  # offline model


def scope_of(database_url: str, session_id: str) -> list[tuple[str | None]]:
    return [(s,) for (s,) in db(database_url, "SELECT memory_scope FROM sessions WHERE"
                                " session_id = %s", session_id)]


async def test_start_and_chat_name_the_memory_scope_of_a_new_session(
        client, settings, cli_env, database_url, tmp_path):  # noqa: F811
    sid = f"scoped-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings):
        out = await keel(cli_env, "start", sid, "the harbour code is 4471",
                         "--memory-scope", "acme")
        assert f"started session {sid} (memory scope acme); message recorded as seq 1" in out
        await until(lambda: _named(database_url, sid, "acme"))  # by its first model call
        vault = tmp_path / "vaults" / "acme" / "daily"
        await until(lambda: _holds(vault, "the harbour code is 4471"))
        assert not await _holds(tmp_path / "vault" / "daily", "the harbour code is 4471")

        out = await keel(cli_env, "start", f"{sid}-none", "no memory here", "--no-memory")
        assert "(no long memory)" in out
        await until(lambda: _answered(database_url, f"{sid}-none"))
        assert scope_of(database_url, f"{sid}-none") == [(None,)]

        out = await keel(cli_env, "chat", "--memory-scope", "beta",
                         input="first words\n/new\nsecond words\n/quit\n")
        started = [line.split("started session ", 1)[1].split(" ", 1)[0]
                   for line in out.splitlines() if "started session " in line]
        assert len(started) == 2 and out.count("(memory scope beta)") == 2
        for new in started:
            await until(lambda new=new: _named(database_url, new, "beta"))
        out = await keel(cli_env, "chat", sid, "--memory-scope", "beta", input="/quit\n")
        assert "its memory scope was fixed at its start" in out

    out = await keel(cli_env, "start", "--memory-scope", "Not Valid", code=2)
    assert "memory scope 'Not Valid' is not a valid scope id" in out
    out = await keel(cli_env, "start", "--memory-scope", "a", "--no-memory", code=2)
    assert "give --memory-scope or --no-memory, not both" in out


async def _named(database_url: str, session_id: str, scope: str) -> bool:
    return scope_of(database_url, session_id) == [(scope,)]


async def _answered(database_url: str, session_id: str) -> bool:
    return bool(db(database_url, "SELECT 1 FROM messages WHERE session_id = %s AND"
                   " type = 'assistant'", session_id))


async def _holds(folder, words: str) -> bool:
    return folder.is_dir() and any(words in f.read_text() for f in folder.glob("*.md"))
