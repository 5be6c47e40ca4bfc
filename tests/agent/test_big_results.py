"""A service tool's result of any size reaches the model cut to its cap and is kept whole
(issue 21, defect 2): the service's worker keeps a large result in Keel's store and the
history carries a small pointer (workers.payload_refs), never a payload over Temporal's
limit. Real Temporal, PostgreSQL, the fake Messages API, the service's worker in this
process on its own queue with its own client."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.results import RESULTS_SCOPE, keep_whole, read_payload, split_utf8
from activities.workspace import LocalStore, open_store
from keel.service import ServiceToolset
from schemas.agent import AgentSpec
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from workers.payload_refs import RESULT_BY_REFERENCE_BYTES, service_converter

FIVE_MB = 5_000_000
LINE = "catalogue item 0000000 ok\n"  # 26 characters


def catalogue(size: int) -> str:
    lines = (LINE.replace("0000000", f"{i:07d}") for i in range(size // len(LINE) + 1))
    return "".join(lines)[:size]


@asynccontextmanager
async def service(client: Client, converter) -> AsyncIterator[AgentSpec]:
    """The service's worker on a queue of its own, its client with `converter`."""
    tools = ServiceToolset(task_queue=f"catalogue-{uuid.uuid4().hex[:8]}")

    @tools.tool(description="Export the whole catalogue as text.")
    async def export_catalogue(size: int) -> str:
        return catalogue(size)

    own = Client(client.service_client, namespace=client.namespace, data_converter=converter)
    async with Worker(own, task_queue=tools.task_queue, activities=tools.activities()):
        yield AgentSpec(tools=tools.declarations())


def tool_result(database_url: str, session_id: str) -> tuple[str, dict]:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT content_text, content FROM messages WHERE session_id=%s"
                           " AND type='tool_result'", (session_id,)).fetchone()
        assert row is not None, "no tool result recorded"
        return row


async def test_a_5mb_service_result_is_cut_for_the_model_and_kept_whole_in_parts(
        client, database_url, fake_anthropic, tmp_path):
    # Files of at most 2 MB: the whole result is kept in three parts.
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url).model_copy(
        update={"max_file_bytes": 2_000_000})
    fake_anthropic.push(tool_use_message([("export_catalogue", {"size": FIVE_MB})]),
                        text_message("exported"))
    async with service(client, service_converter(settings)) as spec, \
            keel_worker(client, settings) as keel:
        session = await keel.start_session(f"big-{uuid.uuid4().hex[:8]}", agent=spec)
        outcome = await session.ask("Export the catalogue.")
        history = await session.handle.fetch_history()
    assert outcome.reply_text == "exported" and outcome.error is None
    whole = catalogue(FIVE_MB)
    text, content = tool_result(database_url, session.session_id)
    call_id = content["tool_use_id"]
    assert not content["is_error"] and content["cut"]
    assert text.startswith(whole[:20_000])
    assert (f"[result cut at 20000 of {FIVE_MB} characters; the whole result is in 3 parts, "
            f".keel/results/{call_id}.part-1.txt to .part-3.txt; read them with read_file]"
            ) in text
    # The model read the cut result as the call's tool result.
    sent = [b for b in fake_anthropic.requests[1]["messages"][-1]["content"]
            if b.get("type") == "tool_result"]
    assert [b["content"] for b in sent] == [text]
    store = open_store(settings)
    parts = [await store.read(session.session_id, f".keel/results/{call_id}.part-{n}.txt")
             for n in (1, 2, 3)]
    assert b"".join(p.data for p in parts if p).decode() == whole
    # No payload in the history came near the limit: the result travelled by reference.
    assert max(e.ByteSize() for e in history.events) < RESULT_BY_REFERENCE_BYTES


async def test_a_result_over_the_limit_without_result_storage_says_how_to_send_it(
        client, database_url, fake_anthropic, tmp_path):
    """A service worker with a plain converter: the SDK refuses to send 3 MB; the model gets
    an error result naming the limit and the way out, and the turn goes on."""
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    fake_anthropic.push(tool_use_message([("export_catalogue", {"size": 3_000_000})]),
                        text_message("too big"))
    async with service(client, pydantic_data_converter) as spec, \
            keel_worker(client, settings) as keel:
        session = await keel.start_session(f"plain-{uuid.uuid4().hex[:8]}", agent=spec)
        outcome = await session.ask("Export the catalogue.")
    assert outcome.reply_text == "too big"
    text, content = tool_result(database_url, session.session_id)
    assert content["is_error"]
    assert "over Temporal's payload limit (2097152 bytes)" in text
    assert "service_converter" in text


async def test_keep_whole_writes_one_file_or_parts_never_inside_a_character(tmp_path):
    store = LocalStore(tmp_path / "w", tmp_path, max_file_bytes=10, max_workspace_bytes=10**6)
    assert await keep_whole(store, "s", "c1", "short") == (
        "the whole result is in .keel/results/c1.txt; read it with read_file")
    text = "a" + "é" * 12  # 25 bytes: 9 (a cut inside "é" moves back), 10, 6
    where = await keep_whole(store, "s", "c2", text)
    assert where.startswith("the whole result is in 3 parts")
    parts = [await store.read("s", f".keel/results/c2.part-{n}.txt") for n in (1, 2, 3)]
    assert b"".join(p.data for p in parts if p).decode() == text
    assert all(p is not None and len(p.data) <= 10 for p in parts)
    assert split_utf8("é".encode() * 3, 3) == ["é".encode()] * 3


KEPT = {"scope": RESULTS_SCOPE, "path": f"payloads/{'0' * 64}.bin", "sha256": "0" * 64,
        "size": "1"}


@pytest.mark.parametrize("ref, why", [
    ({**KEPT, "scope": "a-session"}, "no kept payload"),
    ({**KEPT, "path": "notes.txt"}, "no kept payload"),
    ({**KEPT, "sha256": "../x"}, "no kept payload"),
    (KEPT, "not in the store"),
])
async def test_a_reference_must_name_a_kept_payload(tmp_path, ref, why):
    store = LocalStore(tmp_path / "w", tmp_path, max_file_bytes=10, max_workspace_bytes=10**6)
    with pytest.raises(ValueError, match=why):
        await read_payload(store, ref)
