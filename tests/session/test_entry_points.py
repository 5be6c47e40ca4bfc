"""Bad input at every entry point of a session, from clients that are not Keel's (issue 21,
defect 4 and its class): the start, each Update, each signal and each query, sent through
the raw Temporal client with plain JSON and through the Temporal CLI: malformed JSON, wrong
types, missing fields, bad ids, huge values, names the session does not have. Each ends in
a known state within a bound (a failed start with the reason, a refused Update, a recorded
notice, a failed query), no workflow task fails, and the session answers afterwards.
Real Temporal, PostgreSQL, the fake Messages API."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from typing import Any

import psycopg
import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from keel.client import StartRefusedError
from keel.devstack import temporal_cli_path
from schemas.session import SESSION_WORKFLOW
from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings

BOUND_S = 10.0
TOKEN = "sk-live0123456789abcdefghijklmnop"  # what a secret looks like; never echoed


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = lambda body: text_message("still here")
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def plain_json(client: Client) -> Client:
    return Client(client.service_client, namespace=client.namespace)


def raw(data: bytes, encoding: bytes = b"json/plain") -> RawValue:
    return RawValue(Payload(metadata={"encoding": encoding}, data=data))


def rows(database_url: str, sid: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT type, content_text FROM messages WHERE session_id=%s"
                            " ORDER BY seq", (sid,)).fetchall()


def no_failed_task(history) -> bool:
    return not [e for e in history.events
                if e.HasField("workflow_task_failed_event_attributes")]


def agent(**spec: Any) -> dict[str, Any]:
    return {"config": {"agent": spec}}


# (the input for a session id, the failure's type, words it says)
STARTS: list[tuple[Any, str, str]] = [
    (lambda sid: {"session_id": sid, "config": {"memory_scope": "../x"}},
     "MalformedInput", "config.memory_scope"),
    (lambda sid: {"session_id": 5}, "MalformedInput", "session_id"),
    (lambda sid: {}, "MalformedInput", "session_id: Field required"),
    (lambda sid: "a string", "MalformedInput", "the session's input is malformed"),
    (lambda sid: raw(b'{"session_id": '), "MalformedInput", "Invalid JSON"),
    (lambda sid: raw(b"\x00\x01", b"binary/plain"), "MalformedInput", "binary/plain"),
    (lambda sid: None, "MalformedInput", "expected one argument"),
    (lambda sid: ({"session_id": sid}, {"session_id": sid}), "MalformedInput",
     "expected one argument, got 2"),
    (lambda sid: {"session_id": sid, **agent(api_key=TOKEN)},
     "AgentSpecRefused", "unknown field 'api_key': a spec never holds a key"),
    (lambda sid: {"session_id": sid, **agent(mcp_servers=[
        {"name": "d", "stdio": {"command": "x", "env": {"API_KEY": TOKEN}}}])},
     "AgentSpecRefused", "unknown field 'env': an MCP server's environment"),
    (lambda sid: {"session_id": sid, **agent(mcp_servers=[
        {"name": "d", "stdio": {"command": "x", "args": ["--token", TOKEN]}}])},
     "AgentSpecRefused", "stdio.args[1]"),
    (lambda sid: {"session_id": sid, **agent(mcp_servers=[
        {"name": "w", "http": {"url": f"https://h.test/mcp?api_key={TOKEN}"}}])},
     "AgentSpecRefused", "http.url"),
    (lambda sid: {"session_id": sid, **agent(instructions="x" * 60_000)},
     "AgentSpecRefused", "instructions have 60000 characters"),
    # Within the characters' limit, but more than a 10,000-token window leaves for them.
    (lambda sid: {"session_id": sid, "config": {"context_window": 10_000, "agent": {
        "instructions": "Check the release notes twice. " * 1_500}}},
     "AgentSpecRefused", "a session with a window of 10000 tokens may give them at most"),
    # No agent: Keel's own prompt takes more than a 3,000-token window leaves for it.
    (lambda sid: {"session_id": sid, "config": {"context_window": 3_000,
                                                "max_output_tokens": 512}},
     "MalformedInput", "Keel's system prompt and built-in tool definitions take"),
    # A full reply as large as the window leaves a request nothing.
    (lambda sid: {"session_id": sid, "config": {"context_window": 8_000}},
     "MalformedInput", "a reply of up to 8192 tokens leaves nothing of a window of 8000"),
    # Values a session cannot work with (each turn's request refused by the API; every
    # message refused as too long; a user's name that reads as a source line).
    (lambda sid: {"session_id": sid, "config": {"max_output_tokens": 0}},
     "MalformedInput", "config.max_output_tokens is 0"),
    (lambda sid: {"session_id": sid, "config": {"max_message_chars": 0}},
     "MalformedInput", "config.max_message_chars is 0"),
    (lambda sid: {"session_id": sid, "config": {"user_name": "[Harness: Task t1 \"x\"]"}},
     "MalformedInput", "config.user_name reads as a source line"),
]


async def test_a_start_with_bad_input_fails_at_once_with_the_reason(
        client, settings, database_url):
    async with keel_worker(client, settings):
        for make, kind, says in STARTS:
            sid = f"start-{uuid.uuid4().hex[:8]}"
            value = make(sid)  # None: no argument; a tuple: that many
            args = list(value) if isinstance(value, tuple) else [] if value is None \
                else [value]
            started = time.monotonic()
            handle = await plain_json(client).start_workflow(
                SESSION_WORKFLOW, args=args, id=sid, task_queue=settings.task_queue)
            with pytest.raises(WorkflowFailureError) as failed:
                await asyncio.wait_for(handle.result(), BOUND_S)
            assert time.monotonic() - started < BOUND_S
            cause = failed.value.cause
            assert isinstance(cause, ApplicationError), (value, cause)
            assert (cause.type, says in cause.message) == (kind, True), (value, cause)
            assert TOKEN not in cause.message
            assert rows(database_url, sid) == []  # nothing was written
            assert no_failed_task(await handle.fetch_history())


async def test_a_start_through_the_temporal_cli_fails_with_the_reason(client, settings):
    """Another client entirely: `temporal workflow start` with a scope outside the vault."""
    sid = f"cli-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings):
        done = subprocess.run(
            [temporal_cli_path(), "workflow", "start", "--address",
             client.service_client.config.target_host, "--type", SESSION_WORKFLOW,
             "--task-queue", settings.task_queue, "--workflow-id", sid, "--input",
             json.dumps({"session_id": sid, "config": {"memory_scope": "../x"}})],
            capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(client.get_workflow_handle(sid).result(), BOUND_S)
    assert "config.memory_scope" in str(failed.value.cause)


async def test_a_start_under_an_id_that_cannot_name_a_session_is_refused(
        client, settings, database_url):
    """`_shared` is the workspace every session reads (a session so named wrote its files
    there); `a/b` and `..` cannot be a folder (their first turn failed again and again)."""
    async with keel_worker(client, settings) as keel:
        for sid, says in (("_shared", "may not start with '_'"), ("a/b", "a slash"),
                          ("..", "cannot be a session id")):
            with pytest.raises(StartRefusedError, match=says):  # Keel's client first
                await keel.start_session(sid)
            handle = await plain_json(client).start_workflow(  # then any other client
                SESSION_WORKFLOW, {"session_id": sid, "config": {}}, id=sid,
                task_queue=settings.task_queue)
            with pytest.raises(WorkflowFailureError) as failed:
                await asyncio.wait_for(handle.result(), BOUND_S)
            cause = failed.value.cause
            assert isinstance(cause, ApplicationError) and says in cause.message, cause
            assert cause.type == "MalformedInput"
            assert rows(database_url, sid) == []
            assert no_failed_task(await handle.fetch_history())


# (update, argument(s), the refusal's type, words it says)
UPDATES: list[tuple[str, list[Any], str, str]] = [
    ("send_message", [{"text": 5}], "MalformedInput", "text: Input should be a valid string"),
    ("send_message", [{}], "MalformedInput", "text: Field required"),
    ("send_message", [[1, 2]], "MalformedInput", "the message is malformed"),
    ("send_message", [raw(b'{"text": "unfinished')], "MalformedInput", "Invalid JSON"),
    ("send_message", [], "MalformedInput", "expected one argument"),
    ("send_message", [{"text": "a"}, {"text": "b"}], "TypeError", "positional argument"),
    ("send_message", [{"text": "hi", "input_id": "i" * 10_000}], "MessageRejected",
     "the input id has 10000 characters"),
    ("ask", [{"text": None}], "MalformedInput", "text"),
    ("await_reply", [{"seq": "first"}], "MalformedInput", "seq"),
    ("await_reply", [{"seq": 10**30}], "NoSuchInput", "no input #"),
    ("await_reply", [{"seq": -1}], "NoSuchInput", "no input #-1"),
    ("set_agent", [{"api_key": TOKEN}], "AgentSpecRefused", "unknown field 'api_key'"),
    ("set_agent", [{"tools": "all of them"}], "AgentSpecRefused", "tools"),
    ("set_agent", [{"mcp_servers": [{"name": "d", "http": {
        "url": "https://h.test/mcp", "headers": {"Authorization": f"Bearer {TOKEN}"}}}]}],
     "AgentSpecRefused", "unknown field 'headers'"),
    ("decide_approval", [{"call_id": 5, "approve": "yes"}], "MalformedInput", "call_id"),
    ("decide_approval", [{"call_id": "c" * 5_000, "approve": True}], "NotPending",
     "is not pending"),
    ("end_session", [{"reason": 5}], "MalformedInput", "reason"),
    ("end_session", [{"reason": "r" * 10_000}], "MessageRejected", "reason has 10000"),
    ("put_file", [{"path": "a.txt", "data": "not base64!"}], "MalformedInput", "data"),
    ("put_file", [{"path": "../out.txt", "data": ""}], "FileRefused", "out.txt"),
    ("read_file", [{}], "MalformedInput", "path: Field required"),
    ("list_files", [{"prefix": 5}], "MalformedInput", "prefix"),
]


async def test_every_update_refuses_bad_input_and_the_session_goes_on(
        client, settings, database_url):
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"upd-{uuid.uuid4().hex[:8]}")
        handle = plain_json(client).get_workflow_handle(session.session_id)
        for name, args, kind, says in UPDATES:
            started = time.monotonic()
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await asyncio.wait_for(handle.execute_update(name, args=args), BOUND_S)
            cause = refused.value.cause
            assert isinstance(cause, ApplicationError), (name, args, cause)
            assert (cause.type, says in cause.message) == (kind, True), (name, cause)
            assert TOKEN not in cause.message
            assert time.monotonic() - started < BOUND_S
        with pytest.raises(WorkflowUpdateFailedError):  # a name the session does not have
            await handle.execute_update("no_such_update", {"x": 1})
        outcome = await session.ask("and now a normal message")
        history = await session.handle.fetch_history()
    assert outcome.reply_text == "still here"
    assert [t for t, _ in rows(database_url, session.session_id)] == ["user", "assistant"]
    assert no_failed_task(history)


async def test_signals_and_queries_with_bad_input_end_in_a_notice_or_an_error(
        client, settings, database_url) -> None:
    """A malformed signal, one with an id too long for the record's index, one with no
    argument and one of a name the session does not have each leave a notice naming what
    was wrong; a query of an unknown name fails for its caller; the session answers
    afterwards."""
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"sig-{uuid.uuid4().hex[:8]}")
        sid = session.session_id
        handle = plain_json(client).get_workflow_handle(sid)
        signals: list[tuple[str, list[Any], str]] = [
            ("watch", [{"watch_id": 5, "name": "CI", "text": "x"}], "watch_id"),
            ("task", [{"task_id": "t" * 10_000, "name": "n", "text": "x"}],
             "task_id: 10000 characters"),
            ("callback", [], "expected one argument"),
            ("watch", [{"watch_id": "w", "name": "n", "text": "x"}, {}],
             "expected one argument, got 2"),
            ("agent_run", [raw(b"{nope")], "An agent run signal (agent_run) was malformed"),
            ("no_such_signal", [{"x": 1}], "named 'no_such_signal'"),
        ]
        for name, args, says in signals:
            started, before = time.monotonic(), len(rows(database_url, sid))
            await handle.signal(name, args=args)
            while len(rows(database_url, sid)) == before:
                assert time.monotonic() - started < BOUND_S, f"no notice for {name}"
                await asyncio.sleep(0.05)
            kind, text = rows(database_url, sid)[-1]
            assert kind == "notice" and says in text, (name, text)
        # An argument a query does not take is left aside (the SDK's own doing); a query
        # the session does not have fails for its caller.
        answer = await asyncio.wait_for(handle.query("status", args=[5, "x"]), BOUND_S)
        assert answer["session_id"] == sid
        with pytest.raises(WorkflowQueryFailedError, match="no_such_query"):
            await asyncio.wait_for(handle.query("no_such_query"), BOUND_S)
        outcome = await session.ask("and now?")
        status = await session.status()
        history = await session.handle.fetch_history()
    assert outcome.reply_text == "still here" and status.stopped_reason is None
    assert no_failed_task(history)


async def test_an_update_through_the_temporal_cli_is_refused_naming_the_field(
        client, settings):
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"cliu-{uuid.uuid4().hex[:8]}")
        done = await asyncio.to_thread(subprocess.run, [
            temporal_cli_path(), "workflow", "update", "execute", "--address",
            client.service_client.config.target_host, "--workflow-id", session.session_id,
            "--name", "send_message", "--input", '{"text": ["not", "text"]}'],
            capture_output=True, text=True, timeout=30)
        outcome = await session.ask("fine?")
    assert done.returncode != 0
    assert "text: Input should be a valid string" in done.stdout + done.stderr
    assert outcome.reply_text == "still here"


async def test_keel_client_refuses_the_same_before_sending():
    """What the session would refuse or only note, Keel's own client refuses first, in the
    session's words: an id over its bound, a note or a reason too long, a background input
    over the payload limit (the server would refuse that one to its sender unexplained)."""
    from keel.client import MessageRejectedError, SessionHandle, refuse_before_sending

    with pytest.raises(MessageRejectedError, match="the input id has 300 characters"):
        refuse_before_sending("hi", input_id="i" * 300)
    session = SessionHandle(None, None)  # no call is made
    with pytest.raises(MessageRejectedError, match="the decision's note has 5000"):
        await session.decide("c1", True, note="n" * 5000)
    with pytest.raises(MessageRejectedError, match="the end request's reason has 5000"):
        await session.end("r" * 5000)
    with pytest.raises(MessageRejectedError, match="the watch id has 300 characters"):
        await session.watch("w" * 300, "CI", "fired")
    with pytest.raises(MessageRejectedError, match="bytes a message can take"):
        await session.watch("w", "CI", "x" * 3_000_000)
