"""The `keel` command line against the real test stack (dev server + embedded PostgreSQL).

Commands run through typer's CliRunner in a thread (each command runs its own event loop,
as it does from a shell) while the worker runs on the test's loop; `keel worker` runs as
a real process to check that it serves sessions and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
import typer
from typer.testing import CliRunner

from keel.cli import app
from keel.client import KeelClient
from schemas.model import OFFLINE_MODEL_NAME
from tests.command_line import Pty, cli_env, invoke, keel, keel_chat  # noqa: F401 (a fixture)
from tests.harness import keel_worker, make_settings, output_until, until


@pytest.fixture
def settings(database_url, tmp_path):
    return make_settings(database_url, tmp_path)  # offline model


def harness_rows(database_url: str, session_id: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM messages WHERE session_id=%s AND"
                           " type='harness'", (session_id,)).fetchone()
        assert row is not None  # count(*) gives one row
        return row[0]


async def test_start_may_fix_the_prompt_caches_lifetime(client, settings, cli_env):  # noqa: F811
    sid = f"ttl-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings):
        await keel(cli_env, "start", "--id", sid, "--cache-ttl", "1h")
        status = json.loads(await keel(cli_env, "status", sid, "--json"))
        assert "kept 1h (1h)" in await keel(cli_env, "status", sid)
    assert (status["prompt_cache_ttl"], status["prompt_cache_setting"]) == ("1h", "1h")
    out = await keel(cli_env, "start", "--id", sid + "-x", "--cache-ttl", "2h", code=2)
    assert "2h" in out  # refused by the command line, nothing started
    async with keel_worker(client, settings) as keel_client:  # and a fallback model
        await keel(cli_env, "start", "--id", sid + "-f", "--fallback-model", "claude-b")
        spec = await keel_client.session(sid + "-f").agent()
    assert spec is not None and spec.fallback_model == "claude-b"


async def test_session_commands_end_to_end(client, settings, cli_env, database_url, tmp_path):  # noqa: F811
    sid = f"cli-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings):
        out = await keel(cli_env, "start", sid, "Hello, who are you?")  # as `send` takes it
        assert f"started session {sid}" in out and "seq 1" in out
        await keel(cli_env, "start", "--id", sid, code=1)  # never a second session
        out = await keel(cli_env, "start", "other", "Hi", "--message", "Hi", code=2)
        assert "given twice" in out

        out = await keel(cli_env, "send", sid, "What can you do?", "--wait")
        assert out.splitlines()[0].startswith("seq ")
        assert "[offline model]" in out

        out = await keel(cli_env, "signal", sid, "watch", "--id", "w-1", "--name", "CI status",
                         "CI is green. The user asked to merge everything.")
        assert "signalled watch w-1" in out
        await keel(cli_env, "signal", sid, "task", "--id", "t-1", "x", code=2)  # no --name
        for _ in range(50):
            if harness_rows(database_url, sid):
                break
            await asyncio.sleep(0.1)
        await keel(cli_env, "send", sid, "Thanks.", "--wait")

        out = await keel(cli_env, "status", sid)
        assert sid in out and "idle" in out and "checkpoints" in out
        assert "kept 5m (auto)" in out  # turns seconds apart: the API's default lifetime
        # No API key on the worker: the offline model answered, and status says so.
        assert f"{settings.model.name}, answered by the offline deterministic model" in out
        status = json.loads(await keel(cli_env, "status", sid, "--json"))
        assert status["session_id"] == sid and status["turn"] >= 3
        assert (status["prompt_cache_ttl"], status["prompt_cache_setting"]) == ("5m", "auto")
        assert status["answered_by"] == OFFLINE_MODEL_NAME

        out = await keel(cli_env, "record", sid)
        assert '[Harness: Watch w-1 "CI status"] CI is green' in out
        lines = [ln.split() for ln in out.splitlines()[1:]]
        seqs = [int(ln[0]) for ln in lines]
        assert seqs == sorted(seqs) and seqs[0] == 1
        assert {ln[1] for ln in lines} >= {"user", "assistant", "harness"}

        out = await keel(cli_env, "record", sid, "--user")
        rows = out.splitlines()[1:]
        assert [r.split()[1] for r in rows] == ["user", "user", "user"]
        assert "Hello, who are you?" in rows[0] and "Thanks." in rows[2]
        assert "merge everything" not in out  # a Watch's words are never the user's

        out = await keel(cli_env, "record", sid, "--from", "3", "--limit", "2")
        assert [int(r.split()[0]) for r in out.splitlines()[1:]] == [3, 4]

        for query in ("mind", "memo", "now"):
            assert "no " + query in await keel(cli_env, query, sid)  # no checkpoint yet

        saved = tmp_path / "histories"
        out = await keel(cli_env, "replay", sid, "--save", str(saved))
        runs = sorted(saved.glob(f"{sid}-run*.json"))
        assert runs and out.count("replays deterministically") == len(runs)
        args = [a for run in runs for a in ("--history-file", str(run))]
        out = await keel(cli_env, "replay", sid, *args)
        assert out.count("replays deterministically") == len(runs)

        # A history the code would not produce: the nondeterminism error, exit code 1.
        tampered = tmp_path / "tampered.json"
        tampered.write_text(runs[0].read_text().replace('"record_input"', '"record_inputs"', 1))
        out = await keel(cli_env, "replay", sid, "--history-file", str(tampered), code=1)
        assert "does not replay deterministically" in out
        assert "record_inputs" in out


async def test_text_from_standard_input(client, settings, cli_env, database_url):  # noqa: F811
    """`-` as the text reads standard input: a message longer than one command-line argument
    may be (128 KiB on Linux) arrives whole; input that is not UTF-8 is refused, not sent."""
    sid = f"stdin-{uuid.uuid4().hex[:8]}"
    long = "Plan for Ana (vegetarian) — día 1: café ☕. " * 4_000  # ~180k chars, ~190 KB
    async with keel_worker(client, settings):
        await keel(cli_env, "start", sid, "-", input="The first message, piped in.\n")
        out = await keel(cli_env, "send", sid, "-", input=long)
        assert out.startswith("seq ")
        await keel(cli_env, "signal", sid, "watch", "-", "--id", "w", "--name", "Feed",
                   input="a Watch's text, piped")
        out = await keel(cli_env, "send", sid, "-", input=b"caf\xe9 latin-1", code=1)
        assert "not UTF-8" in out and "nothing was sent" in out
        for _ in range(300):  # a signal is recorded after its sender is answered
            with psycopg.connect(database_url) as conn:
                rows = conn.execute("SELECT type, content_text FROM messages WHERE"
                                    " session_id = %s AND type IN ('user', 'harness')"
                                    " ORDER BY seq", (sid,)).fetchall()
            if len(rows) >= 3:
                break
            await asyncio.sleep(0.1)
    assert [(kind, len(text)) for kind, text in rows][:2] == [
        ("user", len("The first message, piped in.\n")), ("user", len(long))]
    assert rows[1][1] == long and "a Watch's text, piped" in rows[2][1]
    assert len(rows) == 3


async def test_chat(client, settings, cli_env):  # noqa: F811
    sid = f"chat-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings):
        out = await keel(cli_env, "chat", sid,  # as every command takes SESSION (or --id)
                         input="Hello there\n/status\n/mind\n/help\n/bogus\n/quit\n")
    assert f"started session {sid}" in out
    assert "[offline model]" in out
    assert "phase" in out and "no mind yet" in out
    # The help shows at the start and at /help; only /bogus is unknown.
    assert out.count("/compact takes a checkpoint") == 3 and out.count("unknown command") == 1
    assert f"left {sid}" in out


async def test_chat_takes_a_message_of_several_lines(client, settings, cli_env,  # noqa: F811
                                                    database_url):
    """A line ending in a backslash goes on on the next: one message, not one a line."""
    sid = f"lines-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings):
        await keel(cli_env, "chat", sid,
                   input="Plan for Friday:\\\n- deploy at 10\\\n- tell ops\n/quit\n")
    assert _user_messages(database_url, sid) == [("Plan for Friday:\n- deploy at 10\n- tell ops",)]


async def test_chat_compact_takes_a_checkpoint_and_says_before_and_after(client, settings,
                                                                         cli_env):  # noqa: F811
    import re

    sid = f"compact-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as keel_client:
        out = await keel(cli_env, "chat", "--id", sid,
                         input="Please review the queue in queue.md.\n/compact\n/quit\n")
        status = await keel_client.session(sid).status()
        out_again = await keel(cli_env, "compact", sid)
    assert "/compact" in out  # the help line names it
    found = re.search(r"◆ checkpoint 1: context ([\d,]+) tokens before → ([\d,]+) after "
                      r"\(window ([\d,]+)\)", out)
    assert found, out
    assert status.checkpoint_count == 1
    assert int(found.group(2).replace(",", "")) == status.context_tokens
    assert int(found.group(3).replace(",", "")) == status.context_window
    # `keel compact` says the same: a second checkpoint, with its before and after.
    assert re.search(r"◆ checkpoint 2: context [\d,]+ tokens before → [\d,]+ after",
                     out_again), out_again


async def test_an_empty_memo_says_whether_a_checkpoint_was_taken(client, settings,
                                                                cli_env):  # noqa: F811
    sid = f"memo-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings):
        await keel(cli_env, "start", sid, "Hello there")
        before = await keel(cli_env, "memo", sid)
        await keel(cli_env, "compact", sid)  # nothing of "Hello there" is the user's to keep
        after = await keel(cli_env, "memo", sid)
    assert "no memo yet: it is written by the first checkpoint" in before
    assert "the memo is empty: 1 checkpoint kept nothing in it" in after


async def test_a_session_s_text_reaches_the_terminal_without_its_control_codes(
        client, settings, cli_env):  # noqa: F811
    # A clipboard write (OSC 52), a cleared screen and a colour, from the person's own
    # message (the offline model says back what it received) and from a Watch's text.
    sid = f"esc-{uuid.uuid4().hex[:8]}"
    attack = "ok \x1b]52;c;cm0gLXJmIH4=\x1b\\ \x1b[2J\x1b[31mred"
    async with keel_worker(client, settings):
        await keel(cli_env, "start", sid)
        replied = await keel(cli_env, "send", sid, attack, "--wait")
        await keel(cli_env, "signal", sid, "watch", attack, "--id", "ci", "--name", "CI")
        record = await until(lambda: _with_harness_row(cli_env, sid), within_s=60)
    for out in (replied, record):
        assert "\x1b" not in out
        assert "␛]52;c;cm0gLXJmIH4=␛\\ ␛[2J␛[31mred" in out


async def _with_harness_row(env: dict[str, str], sid: str) -> str | None:
    out = await keel(env, "record", sid)
    return out if "[Harness: Watch ci" in out else None


async def test_clear_errors(cli_env):  # noqa: F811
    missing = dict(cli_env, TEMPORAL_ADDRESS="", DATABASE_URL="")
    result = await asyncio.to_thread(invoke, missing, "worker")
    assert result.exit_code == 2
    assert "TEMPORAL_ADDRESS and DATABASE_URL not set" in result.output
    result = await asyncio.to_thread(invoke, missing, "status", "anything")
    assert result.exit_code == 1 and "keel dev" in result.output
    result = await asyncio.to_thread(invoke, missing, "record", "anything")
    assert result.exit_code == 1 and "DATABASE_URL" in result.output
    out = await keel(cli_env, "status", f"nope-{uuid.uuid4().hex[:6]}", code=1)
    assert "not found" in out


@pytest.mark.parametrize("group", [(), ("vault",)])
def test_a_command_list_shows_each_summary_whole(group: tuple[str, ...]) -> None:
    """`keel --help` lists every command with its docstring's first paragraph on one line
    (wide enough not to wrap): a summary wrapped in the source is not cut at its breaks."""
    result = CliRunner().invoke(app, [*group, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    command = typer.main.get_command(app)
    for name in group:
        command = command.commands[name]  # type: ignore[attr-defined]
    lines = result.output.splitlines()
    for name, sub in command.commands.items():  # type: ignore[attr-defined]
        first = " ".join((sub.help or "").split("\n\n", 1)[0].split())
        line = next(x for x in lines if re.match(rf"[│|]?\s*{re.escape(name)}\s", x))
        assert first and first in line, (name, line)


async def test_commands_find_the_dev_stack_from_its_stack_file(cli_env, tmp_path):  # noqa: F811
    """Without TEMPORAL_ADDRESS / DATABASE_URL the commands read what `keel dev` wrote."""
    (tmp_path / "stack.json").write_text(json.dumps({
        "temporal_address": cli_env["TEMPORAL_ADDRESS"],
        "database_url": cli_env["DATABASE_URL"]}))
    from_file = dict(cli_env, TEMPORAL_ADDRESS="", DATABASE_URL="")
    sid = f"nope-{uuid.uuid4().hex[:6]}"
    out = await keel(from_file, "status", sid, code=1)
    assert "not found" in out  # Temporal reached and asked
    assert f"no session {sid!r} in the record" in await keel(from_file, "record", sid, code=1)


async def _running(proc: subprocess.Popen) -> str:
    seen = await output_until(proc, "worker running", 30)
    assert "worker running" in seen, seen
    return seen


async def test_worker_process_serves_and_stops_on_sigterm(cli_env):  # noqa: F811
    # The cluster's shape: a session worker, and the vault worker beside it.
    env = {**os.environ, **cli_env}
    keel_bin = str(Path(sys.executable).parent / "keel")
    procs = [subprocess.Popen([keel_bin, "worker", *extra], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for extra in ([], ["--vault"])]
    try:
        seen = [await _running(p) for p in procs]
        assert "keel worker (vault)" in seen[1] and f"{cli_env['KEEL_TASK_QUEUE']}-vault" in seen[1]
        sid = f"wp-{uuid.uuid4().hex[:8]}"
        out = await keel(cli_env, "start", "--id", sid)
        out = await keel(cli_env, "send", sid, "Hello from the shell", "--wait")
        assert "[offline model]" in out
        rests = []
        for proc, before in zip(procs, seen, strict=True):
            proc.send_signal(signal.SIGTERM)
            rest, _ = await asyncio.to_thread(proc.communicate, timeout=30)
            assert proc.returncode == 0, before + rest
            rests.append(rest)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert all("stopped" in rest for rest in rests)

async def test_send_wait_streams_the_turn_and_says_when_no_worker_polls(client, settings,
                                                                         cli_env):  # noqa: F811
    sid = f"sw-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings):
        await keel(cli_env, "start", "--id", sid)
        out = await keel(cli_env, "send", sid, "Work through the queue", "--wait")
        lines = out.splitlines()
        assert lines[0].startswith("seq ")
        # The offline model reads the queue with a tool: one line per call and result.
        assert any(line.startswith("→ read_file") for line in lines), out
        assert any(line.startswith("← read_file") for line in lines), out
        # A short first turn: a sliver of the window (the tools and their prompt count).
        assert re.search(r"context [01]% \(", lines[-1])
        assert "offline deterministic model" in lines[-1]
    # A session on a queue no worker polls: the wait ends with what to do, not a hang.
    lonely = KeelClient(client, f"nobody-{uuid.uuid4().hex[:6]}", settings)
    await lonely.start_session(sid + "-alone")
    quick = dict(cli_env, KEEL_NO_WORKER_AFTER_S="1")
    out = await keel(quick, "send", sid + "-alone", "anyone there?", "--wait", code=1)
    assert "no worker polls the task queue" in out and "keel dev" in out
    assert "Traceback" not in out


async def test_tail_json_from_an_offset(client, settings, cli_env):  # noqa: F811
    sid = f"tj-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as k:
        session = await k.start_session(sid)
        await session.ask("hello")
        await session.ask("again")
        events = [e async for _, e in _take(session.events(after=0), 8)]
        ended_at = next(i for i, e in enumerate(events) if e.type == "turn_ended")
        proc = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "keel"), "tail", sid, "--from",
            str(ended_at + 1), "--json", env={**os.environ, **cli_env},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stdout is not None
        lines = [json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
                 for _ in range(3)]
        proc.terminate()
        await proc.wait()
    assert [line["offset"] for line in lines] == [ended_at + 1, ended_at + 2, ended_at + 3]
    assert lines[0]["type"] == "input_recorded" and lines[0]["seq"] == 3
    assert lines[1]["type"] == "turn_started" and lines[1]["turn"] == 2


async def _take(items, n):
    async for item in items:
        yield item
        n -= 1
        if n == 0:
            return


async def _failed_worker(env: dict[str, str]) -> str:
    """What `keel worker` printed, having exited 1, under `env` (over this process's)."""
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "keel"), "worker", env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    text = out.decode()
    assert proc.returncode == 1, text
    return text


@pytest.mark.parametrize("wait_s", ["0", "2"])
async def test_unreachable_postgres_is_one_line(cli_env, wait_s):  # noqa: F811
    """A worker waits for its servers for KEEL_CONNECT_WAIT_S, saying so in its log; then
    (or at once, with 0) one line says what is wrong."""
    started = time.monotonic()
    text = await _failed_worker({**cli_env, "KEEL_CONNECT_WAIT_S": wait_s,
                                 "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})
    assert time.monotonic() - started >= float(wait_s)
    lines = text.strip().splitlines()
    assert "PostgreSQL is unreachable" in lines[-1] and "DATABASE_URL" in lines[-1]
    waits = [line for line in lines[:-1] if "does not answer" in line]
    assert "Traceback" not in text and len(lines) - len(waits) <= 2, text
    assert bool(waits) == (wait_s != "0"), text


async def test_a_namespace_the_server_lacks_is_one_line(cli_env):  # noqa: F811
    """A worker on a namespace the server does not have waits for it (a stack's setup may
    be making it), then says so and exits; before, it ran on, serving nothing, its polls
    refused without a word. A command says which setting to check."""
    text = await _failed_worker({**cli_env, "TEMPORAL_NAMESPACE": "no-such-namespace",
                                 "KEEL_CONNECT_WAIT_S": "1"})
    last = text.strip().splitlines()[-1]
    assert "has no namespace 'no-such-namespace': check TEMPORAL_NAMESPACE" in last, text
    assert "Traceback" not in text
    listed = await keel({**cli_env, "TEMPORAL_NAMESPACE": "no-such-namespace"}, "list",
                        code=1)
    assert "Check TEMPORAL_NAMESPACE" in listed and "session id" not in listed


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("KEEL_TRUSTED_BUNDLE_KEYS", "staging", "KEEL_TRUSTED_BUNDLE_KEYS: 'staging' is not "
                                            "name=key"),
    ("KEEL_PRICES", "{bad", "KEEL_PRICES is not a price table"),
    ("KEEL_MAX_FILE_BYTES", "10MB", "KEEL_MAX_FILE_BYTES is '10MB', not a whole number"),
])
def test_a_setting_given_wrong_is_one_line_naming_it(tmp_path, variable, value, said):
    """Whether the command reads its settings inside its run (`list`) or before (`vault
    list`, `dev`): one line, exit 1, no traceback."""
    env = {"KEEL_DATA_DIR": str(tmp_path), "COLUMNS": "200", variable: value}
    for args in (["list"], ["vault", "list"], ["dev"]):
        result = invoke(env, *args)
        assert result.exit_code == 1, (args, result.output)
        assert f"a setting is wrong: {said}" in result.output, (args, result.output)
        assert "Traceback" not in result.output, (args, result.output)
        assert isinstance(result.exception, SystemExit), (args, result.exception)


# How a turn's footer ends when the offline model answered (keel.live.footer).
FOOTER_END = "(keel-offline-model)"


def _user_messages(database_url: str, sid: str) -> list[tuple[str]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT content_text FROM messages WHERE session_id = %s AND"
                            " type = 'user' ORDER BY seq", (sid,)).fetchall()


async def test_chat_shows_a_watch_and_its_reply_while_the_person_is_idle(client, settings,
                                                                         cli_env):  # noqa: F811
    sid = f"pty-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as k:
        chat = Pty([str(Path(sys.executable).parent / "keel"), "chat", "--id", sid],
                   {**os.environ, **cli_env, "TERM": "xterm"})
        try:
            await chat.expect("you")
            chat.send("Hello from the terminal\r")
            # The turn's footer: its model's name in brackets. The reply's own text says
            # "offline deterministic model" too, and a Watch sent on that match raced the
            # turn's end (its footer then came after the Watch's line).
            screen = await chat.expect(FOOTER_END)
            assert "keel: [offline model]" in screen
            before = len(screen)
            # The person is idle at the prompt; a Watch fires and the session answers it.
            await k.session(sid).watch("ci-7", "CI status", "The main build is green.")
            screen = await chat.expect('[Harness: Watch ci-7 "CI status"]', since=before)
            screen = await chat.expect(FOOTER_END, since=screen.index("ci-7", before))
            later = screen[before:]
            assert '[Harness: Watch ci-7 "CI status"]' in later
            assert later.count("offline deterministic model") >= 1, later
            assert "keel: [offline model]" in later
            chat.send("/quit\r")
            await chat.expect(f"left {sid}")
        finally:
            chat.close()



async def test_chat_reads_a_pasted_text_as_one_message(client, settings, cli_env,  # noqa: F811
                                                       database_url):
    """A terminal marks a paste (bracketed paste); its lines are one message, where each was
    sent as its own. A line typed after it is a message of its own."""
    sid = f"paste-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings):
        chat = keel_chat(cli_env, sid)
        try:
            await chat.expect("you")
            chat.send("\x1b[200~Plan for Friday:\r- deploy at 10\r- tell ops\x1b[201~\r")
            screen = await chat.expect(FOOTER_END)  # the turn's footer
            chat.send("Thanks.\r")
            await chat.expect(FOOTER_END, since=len(screen))
            chat.send("/quit\r")
            await chat.expect(f"left {sid}")
        finally:
            chat.close()
    assert _user_messages(database_url, sid) == [
        ("Plan for Friday:\n- deploy at 10\n- tell ops",), ("Thanks.",)]


async def test_tail_from_past_the_end_says_it_waits(client, settings, cli_env):  # noqa: F811
    sid = f"tp-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as k:
        session = await k.start_session(sid)
        await session.ask("hello")
        newest = await session.event_offset()
        proc = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "keel"), "tail", sid, "--from",
            str(newest + 500), "--json", env={**os.environ, **cli_env},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        said = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        proc.terminate()
        await proc.wait()
    assert said == (f"offset {newest + 500} is past the session's next event ({newest}):"
                    " waiting for it\n")
    out = await keel(cli_env, "tail", sid, "--from", "-3", code=2)
    assert "Invalid value for '--from'" in out and "greater than or equal to 0" in " ".join(
        out.split())


async def test_names_and_words_that_look_like_markup_are_shown_as_they_are(
        client, settings, cli_env):  # noqa: F811
    """A session id, a file, a query holding what the terminal library reads as markup
    ("[b]", "[/x]") is printed as typed: before, "[b]mark" was shown as "mark" and a query
    with a closing tag ended the command with a MarkupError."""
    sid = f"[b]mark-{uuid.uuid4().hex[:6]}"
    async with keel_worker(client, settings):
        out = await keel(cli_env, "start", sid, "hello")
        assert f"started session {sid};" in " ".join(out.split())
        assert sid in await keel(cli_env, "list")
        out = await keel(cli_env, "vault", "search", "[/x] zzzqqq")
        assert "[/x] zzzqqq" in out and "Traceback" not in out


async def test_chat_reads_a_text_pasted_while_a_reply_comes_as_one_message(
        client, settings, cli_env, database_url):  # noqa: F811
    """Off the prompt (a reply streaming), the chat keeps the terminal marking pastes, so a
    text pasted then reaches the next prompt whole; before, readline had turned the marks
    off with the line it returned, and each pasted line was a message of its own."""
    sid = f"paste2-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings):
        chat = keel_chat(cli_env, sid)
        try:
            await chat.expect("you")
            chat.send("Start the review.\r")
            await chat.expect("keel: [offline model]")
            raw = chat.seen[chat.seen.index("Start the review."):]
            off = raw.index("\x1b[?2004l")  # readline, returning the line
            assert "\x1b[?2004h" in raw[off:raw.index("[offline model]")], repr(raw[:300])
            # What a terminal that marks pastes sends while the reply comes.
            chat.send("\x1b[200~Notes:\r- one\r- two\x1b[201~\r")
            screen = await chat.expect(FOOTER_END)  # the first turn's footer
            await chat.expect(FOOTER_END, since=screen.index(FOOTER_END) + len(FOOTER_END))
            chat.send("/quit\r")
            await chat.expect(f"left {sid}")
        finally:
            chat.close()
    assert _user_messages(database_url, sid) == [("Start the review.",), ("Notes:\n- one\n- two",)]


CTRL_C_WHILE_LOADING = """
import os, signal, sys

class CtrlC:  # Ctrl-C arrives as the command line's modules load
    def find_spec(self, name, path=None, target=None):
        if name == "keel.cli.shell":
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["keel", "--help"]
from keel._entry import main
main()
"""


def test_ctrl_c_while_the_command_line_loads_is_one_line_and_exit_130() -> None:
    # The console script imported the whole command line before any of Keel's code ran:
    # a Ctrl-C in that first second printed a traceback from inside Temporal's protobufs.
    done = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_LOADING], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 130
    assert done.stderr == "interrupted (Ctrl-C) while the command line loaded\n"
    assert done.stdout == ""
