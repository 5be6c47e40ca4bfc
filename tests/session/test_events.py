"""The session's own event stream (SessionWorkflow, not a stand-in): a turn with tool calls,
a background input and its reply, a checkpoint, in order and with their content; a late
reader from an offset; the stream across continue-as-new and a worker SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from typing import Any

import pytest

from keel.client import EventsMissed, KeelClient, session_config
from schemas.config import KeelSettings
from schemas.events import (
    CheckpointKind,
    CheckpointStarted,
    CheckpointStored,
    EventType,
    InputRecorded,
    TextDelta,
    ToolCalled,
    ToolResult,
    TurnEnded,
    TurnStarted,
)
from tests.checkpoint_model import CheckpointModel, good_checkpoint, texts
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings, reader_seen
from tests.session.streams import TIMEOUT, Reader
from tests.session.worker_process import polling, start_worker
from workflows.events import STREAM_PUBLISH

WINDOW, OUTPUT = 12_000, 512
FILLER = " ".join(f"w{i % 97}" for i in range(1_000))  # about 1,900 tokens


def ordinary(body: dict[str, Any]) -> dict[str, Any]:
    """A tool call when asked for one (once), else a reply naming what it answers."""
    last = " ".join(texts(body["messages"][-1]))
    results = [b for b in body["messages"][-1]["content"]
               if isinstance(b, dict) and b.get("type") == "tool_result"]
    if "write the note" in last and not results:
        return tool_use_message([("write_file", {"path": "note.txt", "content": "alpha"})],
                                text="Writing it.")
    if results:
        return text_message("The note is written.")
    if "Watch" in last:
        return text_message("The watch fired; noted.")
    return text_message("noted " + "and understood " * 20)


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def structure(items: list[tuple[int, Any]]) -> list[str]:
    """The events' types in order, consecutive text deltas folded into one."""
    out: list[str] = []
    for _, e in items:
        kind = str(e.type)
        if kind == EventType.TEXT_DELTA and out and out[-1] == kind:
            continue
        out.append(kind)
    return out


async def test_a_turn_with_tools_a_watch_and_a_checkpoint_arrive_in_order(
        client, settings, fake_anthropic) -> None:
    fake_anthropic.responder = CheckpointModel(good_checkpoint, ordinary=ordinary)
    cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"ev-{uuid.uuid4().hex[:8]}", config=cfg)
        reader = Reader(keel, session.session_id)
        await session.ask("Please write the note.")
        await session.watch("w1", "deploys", "Deploy 42 finished.")
        await reader.until(lambda r: len(r.of(EventType.TURN_ENDED)) >= 2)
        for i in range(6):
            await session.ask(f"Part {i}: {FILLER}")
        await reader.until(lambda r: r.of(EventType.CHECKPOINT_STORED)
                           and len(r.of(EventType.TURN_ENDED)) >= 8)
        late = Reader(keel, session.session_id, after=3)
        await late.until(lambda r: len(r.items) >= len(reader.items) - 3)
        reader.stop()
        late.stop()

    items = reader.items
    assert [o for o, _ in items] == list(range(len(items)))  # each offset once, in order
    first_turn = structure(items)[:9]
    assert first_turn == [
        "input_recorded", "turn_started", "text_delta", "tool_called", "tool_result",
        "text_delta", "turn_ended", "input_recorded", "turn_started"]
    recorded: list[InputRecorded] = reader.of(EventType.INPUT_RECORDED)
    assert (recorded[0].kind, recorded[0].seq) == ("user", 1)
    assert recorded[0].source_line is None  # only background inputs carry one
    assert recorded[1].kind == "watch"
    assert recorded[1].source_line == '[Harness: Watch w1 "deploys"]'
    started: list[TurnStarted] = reader.of(EventType.TURN_STARTED)
    assert started[1].input_seqs == [recorded[1].seq]
    called: ToolCalled = reader.of(EventType.TOOL_CALLED)[0]
    result: ToolResult = reader.of(EventType.TOOL_RESULT)[0]
    assert called.name == "write_file" and '"path":"note.txt"' in called.input
    assert result.tool_use_id == called.tool_use_id and not result.is_error
    assert result.output == "wrote note.txt"
    ended: list[TurnEnded] = reader.of(EventType.TURN_ENDED)
    assert ended[0].reply_preview == "The note is written."
    assert ended[1].reply_preview == "The watch fired; noted."
    # The deltas of a reply add up to the reply the record keeps.
    deltas: list[TextDelta] = [e for e in reader.of(EventType.TEXT_DELTA)
                               if e.reply_seq == ended[1].reply_seq]
    assert "".join(d.text for d in deltas) == "The watch fired; noted."
    # The checkpoint: started, then stored, with tokens before and after.
    cp_started: CheckpointStarted = reader.of(EventType.CHECKPOINT_STARTED)[0]
    stored: CheckpointStored = reader.of(EventType.CHECKPOINT_STORED)[0]
    assert structure(items).index("checkpoint_started") < structure(items).index(
        "checkpoint_stored")
    # A message of a sixth of the window lands it past the threshold by more than the
    # margin: the checkpoint may see only the earlier part (issue 20: every request fits).
    assert stored.kind in (CheckpointKind.FULL, CheckpointKind.EARLIER_PART)
    assert stored.checkpoint_id
    assert stored.tokens_after < stored.tokens_before == cp_started.tokens_before
    # A late reader from offset 3 gets everything from there, the same events.
    assert [o for o, _ in late.items[:5]] == [3, 4, 5, 6, 7]
    assert [(o, e) for o, e in late.items] == items[3:3 + len(late.items)]


async def _publish_signals(client: Any, session_id: str) -> int:
    history = await client.get_workflow_handle(session_id).fetch_history()
    return sum(1 for e in history.events
               if e.HasField("workflow_execution_signaled_event_attributes")
               and e.workflow_execution_signaled_event_attributes.signal_name == STREAM_PUBLISH)


async def test_a_reply_streams_while_read_and_costs_no_signal_when_nobody_reads(
        client, settings, fake_anthropic) -> None:
    """A reply of ~2,400 characters written over about a second, as a model writes: with
    nobody reading, the model call sends no delta (no publish signal in the history, where
    each would be a workflow task and four events) and the workflow publishes the reply's
    text at once with it, so a reader afterwards still finds the deltas; with a reader
    following, the deltas reach it while the reply is being written."""
    reply = " ".join(f"word{i}" for i in range(300))
    fake_anthropic.responder = lambda body: text_message(reply)
    fake_anthropic.stream_delay_s = 0.01
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"ev-{uuid.uuid4().hex[:8]}")
        outcome = await session.ask("Tell me everything.")
        assert outcome.reply_text == reply
        assert await _publish_signals(client, session.session_id) == 0
        late = Reader(keel, session.session_id)
        await late.until(lambda r: r.of(EventType.TURN_ENDED))
        late.stop()
        deltas: list[TextDelta] = late.of(EventType.TEXT_DELTA)
        assert "".join(d.text for d in deltas) == reply
        assert [d.start for d in deltas] == [sum(len(x.text) for x in deltas[:i])
                                             for i in range(len(deltas))]

        reader = Reader(keel, session.session_id, after=await session.event_offset())
        await reader_seen(session.handle)
        ask = asyncio.create_task(session.ask("Again, please."))
        await reader.until(lambda r: r.of(EventType.TEXT_DELTA))
        assert not ask.done()  # the text reached the reader before the reply was whole
        assert (await ask).reply_text == reply
        await reader.until(lambda r: r.of(EventType.TURN_ENDED))
        reader.stop()
        assert "".join(d.text for d in reader.of(EventType.TEXT_DELTA)) == reply
        assert await _publish_signals(client, session.session_id) > 0


async def test_the_stream_goes_on_across_continue_as_new(client, settings, fake_anthropic):
    fake_anthropic.responder = lambda body: text_message("ok")
    cfg = session_config(settings, continue_as_new_after_events=40)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"ev-{uuid.uuid4().hex[:8]}", config=cfg)
        reader = Reader(keel, session.session_id)
        for i in range(8):
            await session.ask(f"message {i}")
        await reader.until(lambda r: len(r.of(EventType.TURN_ENDED)) >= 8)
        runs = [e async for e in client.list_workflows(
            f"WorkflowId = '{session.session_id}'")]
        reader.stop()
    assert len(runs) > 1  # it did continue as new
    assert [o for o, _ in reader.items] == list(range(len(reader.items)))
    assert not [e for _, e in reader.items if isinstance(e, EventsMissed)]
    assert [e.seq for e in reader.of(EventType.INPUT_RECORDED)] == [
        2 * i + 1 for i in range(8)]


async def test_the_stream_goes_on_across_a_worker_sigkill(
        temporal_env, database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = lambda body: text_message("ok")
    queue = f"ev-crash-{uuid.uuid4().hex[:8]}"
    env = {**os.environ,
           "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
           "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": queue,
           "KEEL_DATA_DIR": str(tmp_path), "ANTHROPIC_BASE_URL": fake_anthropic.base_url,
           "ANTHROPIC_API_KEY": "test"}
    keel = KeelClient(temporal_env.client, queue, KeelSettings.from_env(env))
    worker = start_worker(env)
    try:
        await polling(temporal_env.client, queue, worker)
        session = await keel.start_session(f"ev-crash-{uuid.uuid4().hex[:8]}")
        reader = Reader(keel, session.session_id)
        await asyncio.wait_for(session.ask("before"), TIMEOUT)
        await reader.until(lambda r: r.of(EventType.TURN_ENDED))
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        worker = start_worker(env)
        await polling(temporal_env.client, queue, worker)
        accepted = await asyncio.wait_for(session.send("after the restart"), TIMEOUT)
    except BaseException:
        worker.kill()
        raise
    try:
        await asyncio.wait_for(session.wait_reply(accepted.seq), TIMEOUT)
        await reader.until(lambda r: len(r.of(EventType.TURN_ENDED)) >= 2)
    finally:
        reader.stop()
        worker.terminate()
        worker.wait(10)
    assert [o for o, _ in reader.items] == list(range(len(reader.items)))
    assert [e.seq for e in reader.of(EventType.INPUT_RECORDED)] == [1, 3]
    assert [e.turn for e in reader.of(EventType.TURN_ENDED)] == [1, 2]
