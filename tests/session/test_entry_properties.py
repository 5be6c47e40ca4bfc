"""Random input through every entry point of one running session, as another client sends
it (hypothesis, bounded; issue 21): Updates, signals and queries with arguments of the
handler's own shape (its field names, with values of any JSON type, often the wrong one),
agent specs of the spec's shape (a top-level secret, MCP servers, service tools), no
argument, two arguments, JSON that does not parse. Each is answered, recorded, or refused
with a reason, within a bound; no workflow task fails; the session answers a normal
message afterwards."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import psycopg
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings

EXAMPLES = 40
BOUND_S = 10.0
SECRET = "sk-live0123456789abcdef0123"

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=30))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)


def shaped(fields: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts with some of `fields` (each its own strategy, or any JSON value), and now and
    then a field the model does not have."""
    return st.fixed_dictionaries({}, optional={
        **{name: st.one_of(values, json_values) for name, values in fields.items()},
        "extra": json_values})


text = st.text(min_size=1, max_size=40)
ids = st.one_of(st.text(min_size=1, max_size=20), st.just("i" * 300))
mcp_server = shaped({
    "name": st.sampled_from(["docs", "a__b", "", "x" * 40]),
    "stdio": shaped({
        "command": st.sampled_from(["/nonexistent/mcp", ""]),
        "args": st.lists(st.sampled_from(["-v", "--token", SECRET, "--api-key=abc"]),
                         max_size=3),
        "env": st.just({"API_KEY": SECRET}),
        "env_names": st.lists(st.sampled_from(["TOKEN", "a b", "sk_live_0123456789abcd"]),
                              max_size=2)}),
    "http": shaped({"url": st.sampled_from(["http://127.0.0.1:9/mcp", "ftp://x",
                                            "https://u:p@h/mcp", "https://h/mcp?token=abc"]),
                    "header_env": st.dictionaries(st.sampled_from(["Authorization", "Bad H"]),
                                                  st.sampled_from(["WEB_AUTH", "Bearer xyz"]),
                                                  max_size=1),
                    "headers": st.just({"Authorization": "Bearer xyz"})}),
    "call_s": st.sampled_from([0, 5, 10**9]),
})
service_tool = shaped({
    "name": st.sampled_from(["lookup", "read_file", "mcp__x__y", "bad name"]),
    "activity": st.sampled_from(["keel-tool.lookup", ""]),
    "task_queue": st.sampled_from(["nobody-serves-this", ""]),
    "input_schema": st.sampled_from([{"type": "object"}, {"type": "string"},
                                     {"type": "object", "required": True}]),
})
agent_spec = shaped({
    "instructions": text,
    "model": st.sampled_from([None, ""]),  # a real model name only: the fake knows it
    "provider": st.sampled_from([None, 5]),
    "context_window": st.sampled_from([None, 1000, 200_000]),
    "max_output_tokens": st.sampled_from([None, 100, 1024]),
    "builtin_tools": st.one_of(st.none(), st.lists(st.sampled_from(
        ["read_file", "write_file", "no_such_builtin"]), max_size=2)),
    "tools": st.lists(service_tool, max_size=2),
    "mcp_servers": st.lists(mcp_server, max_size=2),
    "approvals": shaped({"tools": st.dictionaries(text, st.sampled_from(["ask", "maybe"]),
                                                  max_size=1),
                         "on_timeout": st.sampled_from(["deny", "explode"])}),
    "api_key": st.just(SECRET),
})
UPDATE_ARGS = {
    "send_message": shaped({"text": text, "input_id": ids}),
    "ask": shaped({"text": text, "input_id": ids}),
    "await_reply": shaped({"seq": st.integers(-5, 10**20)}),
    "set_agent": agent_spec,
    "decide_approval": shaped({"call_id": ids, "approve": st.booleans(), "note": text,
                               "input_digest": text, "by": ids}),
    "put_file": shaped({"path": st.sampled_from(["a.txt", "../x", ".keel/x", ""]),
                        "data": st.sampled_from(["aGVsbG8=", "!!", ""])}),
    "read_file": shaped({"path": st.sampled_from(["a.txt", "../x", "\x00"])}),
    "list_files": shaped({"prefix": st.sampled_from(["", "a", ".keel/"])}),
}
SIGNAL_ARGS = {
    "watch": shaped({"watch_id": ids, "name": text, "text": text, "input_id": ids}),
    "task": shaped({"task_id": ids, "name": text, "text": text, "input_id": ids}),
    "agent_run": shaped({"run_id": ids, "from_session": text, "text": text}),
    "callback": shaped({"run_id": ids, "from_session": text, "text": text}),
    "no_such_signal": json_values,
}
QUERIES = ["status", "mind", "memo", "now", "agent", "pending_approvals", "no_such_query"]
UNPARSABLE = RawValue(Payload(metadata={"encoding": b"json/plain"}, data=b'{"text": '))


def arguments(shape: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """One argument of the shape, mostly; or none, two, or JSON that does not parse."""
    return st.one_of(shape.map(lambda v: [v]), shape.map(lambda v: [v]),
                     st.just([]), st.tuples(shape, json_values).map(list),
                     st.just([UNPARSABLE]))


entry = st.one_of(
    st.tuples(st.just("update"), st.sampled_from(sorted(UPDATE_ARGS))).flatmap(
        lambda k: st.tuples(st.just(k[0]), st.just(k[1]), arguments(UPDATE_ARGS[k[1]]))),
    st.tuples(st.just("signal"), st.sampled_from(sorted(SIGNAL_ARGS))).flatmap(
        lambda k: st.tuples(st.just(k[0]), st.just(k[1]), arguments(SIGNAL_ARGS[k[1]]))),
    st.tuples(st.just("query"), st.sampled_from(QUERIES),
              st.lists(json_values, max_size=1)),
)


def _count(database_url: str, sid: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM messages WHERE session_id=%s"
                           " AND type IN ('harness', 'notice')", (sid,)).fetchone()
        assert row is not None  # count(*) gives one row
        return row[0]


async def test_random_input_at_every_entry_point(client, database_url, fake_anthropic,
                                                 tmp_path) -> None:
    fake_anthropic.responder = lambda body: text_message("ok")
    config = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    loop = asyncio.get_running_loop()
    tried: list[str] = []
    async with keel_worker(client, config) as keel:
        session = await keel.start_session(f"entry-{uuid.uuid4().hex[:8]}")
        sid = session.session_id
        handle = Client(client.service_client, namespace=client.namespace
                        ).get_workflow_handle(sid)

        async def one(kind: str, name: str, args: list[Any]) -> None:
            started = time.monotonic()
            if kind == "update":
                try:
                    await asyncio.wait_for(handle.execute_update(name, args=args), BOUND_S)
                except WorkflowUpdateFailedError as err:
                    cause = err.cause
                    assert isinstance(cause, ApplicationError) and cause.message.strip(), (
                        name, args, cause)
            elif kind == "query":
                try:
                    await asyncio.wait_for(handle.query(name, args=args), BOUND_S)
                except WorkflowQueryFailedError as err:
                    assert str(err).strip()
            else:
                before = _count(database_url, sid)
                await handle.signal(name, args=args)
                # Recorded (a harness row) or refused (a notice), never dropped unsaid.
                while _count(database_url, sid) == before:
                    assert time.monotonic() - started < BOUND_S, (name, args)
                    await asyncio.sleep(0.05)
            assert time.monotonic() - started < BOUND_S, (kind, name, args)

        # No shrinking: one session serves every example, and a session that stalled
        # would make each smaller example wait out its bound too.
        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(entry)
        def drive(case: tuple[str, str, list[Any]]) -> None:
            tried.append(case[1])
            kind, name, args = case
            json.dumps([a for a in args if not isinstance(a, RawValue)])  # plain JSON only
            asyncio.run_coroutine_threadsafe(one(kind, name, args), loop).result(2 * BOUND_S)

        await asyncio.to_thread(drive)
        # Whatever agent the examples left, the next message is answered.
        outcome = await asyncio.wait_for(session.ask("a normal message"), 60)
        history = await session.handle.fetch_history()
        status = await session.status()
    assert outcome.reply_text == "ok" and outcome.error is None
    assert status.stopped_reason is None
    assert not [e for e in history.events
                if e.HasField("workflow_task_failed_event_attributes")]
    assert len(tried) == EXAMPLES
