"""Logging carries the session's identity; tracing produces spans for a session turn."""

from __future__ import annotations

import io
import json
import logging
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

from temporalio import activity, workflow

# This module is imported again inside the workflow sandbox: pass the rest through.
with workflow.unsafe.imports_passed_through():
    import pytest
    import structlog
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from pydantic import BaseModel
    from temporalio.contrib.opentelemetry import TracingInterceptor
    from temporalio.worker import Worker

    from activities.db import ATTEMPT_STARTED
    from keel.client import KeelClient
    from tests.fake_anthropic import text_message, tool_use_message
    from tests.harness import make_settings
    from tests.logs import undo_configure_logging
    from workers.observability import (
        ActivityContextInterceptor,
        KeelTracingInterceptor,
        configure_logging,
        flush_tracing,
        shutdown_tracing,
        tracing_interceptors,
        worker_interceptors,
    )
    from workers.worker import build_worker


class StepInput(BaseModel):
    session_id: str
    turn: int


@activity.defn
async def log_step(data: StepInput) -> str:
    activity.logger.info("stdlib line from an activity")
    structlog.get_logger("keel.test").info("structlog line from an activity", step="x")
    return "ok"


@workflow.defn
class LoggingWorkflow:
    @workflow.run
    async def run(self, data: StepInput) -> str:
        workflow.logger.info("line from the workflow")
        return await workflow.execute_activity(
            log_step, data, start_to_close_timeout=timedelta(seconds=10))


@activity.defn
async def attempt_age(data: StepInput) -> float | None:
    started = ATTEMPT_STARTED.get()
    return None if started is None else time.monotonic() - started


@workflow.defn
class AttemptAgeWorkflow:
    @workflow.run
    async def run(self, data: StepInput) -> float | None:
        return await workflow.execute_activity(
            attempt_age, data, start_to_close_timeout=timedelta(seconds=10))


async def test_a_worker_tells_its_activities_when_their_attempt_started_by_its_clock(
        client, database_url, tmp_path):
    """What activities.db.wait_left counts an attempt's time from (not the server's clock)."""
    settings = make_settings(database_url, tmp_path)
    ages = []
    for interceptors in (worker_interceptors(settings), []):
        async with Worker(client, task_queue=settings.task_queue,
                          workflows=[AttemptAgeWorkflow], activities=[attempt_age],
                          interceptors=interceptors):
            sid = f"age-{uuid.uuid4().hex[:8]}"
            ages.append(await client.execute_workflow(
                AttemptAgeWorkflow.run, StepInput(session_id=sid, turn=1), id=sid,
                task_queue=settings.task_queue))
    assert ages[0] is not None and 0 <= ages[0] < 5
    assert ages[1] is None  # without Keel's interceptor nobody tells it


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    level = logging.getLogger().level
    yield io.StringIO()
    undo_configure_logging(level)


async def test_json_log_lines_carry_session_id_run_id_and_turn(client, database_url, tmp_path,
                                                               log_stream):
    settings = make_settings(database_url, tmp_path)
    settings.log_format = "json"
    configure_logging(settings, level="INFO", stream=log_stream)
    session_id = f"log-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=settings.task_queue, workflows=[LoggingWorkflow],
                      activities=[log_step], interceptors=[ActivityContextInterceptor()]):
        handle = await client.start_workflow(
            LoggingWorkflow.run, StepInput(session_id=session_id, turn=7), id=session_id,
            task_queue=settings.task_queue)
        assert await handle.result() == "ok"
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines()
             if line.startswith("{")]
    by_event = {line["event"]: line for line in lines}
    for event in ("stdlib line from an activity", "structlog line from an activity"):
        line = by_event[event]
        assert line["session_id"] == session_id
        assert line["run_id"] == handle.result_run_id
        assert line["turn"] == 7
        assert line["activity"] == "log_step"
    assert by_event["structlog line from an activity"]["step"] == "x"
    from_workflow = by_event["line from the workflow"]
    assert from_workflow["session_id"] == session_id
    assert from_workflow["run_id"] == handle.result_run_id
    # The context is in fields, not appended to the message a second time.
    assert "workflow_id" not in from_workflow["event"]


def test_console_format_is_the_default(tmp_path, log_stream):
    settings = make_settings("postgresql://unused", tmp_path)
    configure_logging(settings, stream=log_stream)
    logging.getLogger("keel.test").warning("plain %s", "line")
    out = log_stream.getvalue()
    assert "plain line" in out and not out.lstrip().startswith("{")


def test_a_console_line_shows_a_session_s_escape_codes_without_sending_them(tmp_path,
                                                                           log_stream):
    settings = make_settings("postgresql://unused", tmp_path)
    configure_logging(settings, stream=log_stream)
    words = "red \x1b[31m and the clipboard \x1b]52;c;SGk=\x07"
    logging.getLogger("keel.test").warning("MCP server said %s", words)
    structlog.get_logger("keel.test").warning("a tool failed", error=words)
    out = log_stream.getvalue()
    assert "\x1b" not in out and "\x07" not in out
    assert out.count("red ␛[31m and the clipboard ␛]52;c;SGk=␇") == 2


@pytest.mark.parametrize("log_format", ["console", "json"])
def test_a_traceback_never_shows_its_frames_locals(tmp_path, log_stream, log_format):
    """A failed activity's traceback is logged; its frames' locals (a model client's API
    key, a user's message) are not: structlog shows them by default, and did here."""
    settings = make_settings("postgresql://unused", tmp_path)
    settings.log_format = log_format
    configure_logging(settings, stream=log_stream)

    def call_model(api_key: str, text: str) -> None:
        raise ConnectionError("the model API did not answer")
    key, words = f"sk-ant-{uuid.uuid4().hex}", f"my PIN is {uuid.uuid4().int % 10_000}"
    try:  # made at run time: the traceback's source lines cannot show them either
        call_model(key, words)
    except ConnectionError:
        logging.getLogger("keel.test").exception("the call failed")
    out = log_stream.getvalue()
    assert "the model API did not answer" in out and "call_model" in out  # the traceback
    assert key not in out and words not in out, out


def test_no_tracing_unless_configured(tmp_path):
    settings = make_settings("postgresql://unused", tmp_path)
    assert tracing_interceptors(settings) == []
    assert [type(i) for i in worker_interceptors(settings)] == [ActivityContextInterceptor]
    settings.otel_exporter = "console"
    try:
        assert [type(i) for i in tracing_interceptors(settings)] == [KeelTracingInterceptor]
        assert issubclass(KeelTracingInterceptor, TracingInterceptor)
    finally:
        shutdown_tracing()


async def test_spans_for_a_session_turn(client, database_url, tmp_path, fake_anthropic):
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    exporter = InMemorySpanExporter()
    fake_anthropic.push(text_message("traced reply"))
    session_id = f"trace-{uuid.uuid4().hex[:8]}"
    try:
        interceptors = tracing_interceptors(settings, exporter=exporter)
        async with build_worker(client, settings, interceptors=interceptors):
            keel = KeelClient(client, settings.task_queue, settings)
            session = await keel.start_session(session_id)
            outcome = await session.ask("hello, tracing")
        assert outcome.reply_text == "traced reply"
        flush_tracing()
        spans = exporter.get_finished_spans()
    finally:
        shutdown_tracing()
    names = {s.name for s in spans}
    assert "RunActivity:call_model" in names, names  # the turn records its message too
    assert "RunWorkflow:SessionWorkflow" in names, names
    mine = [s for s in spans if (s.attributes or {}).get("temporalWorkflowID") == session_id]
    assert "RunActivity:call_model" in {s.name for s in mine}
    assert "RunActivity:record_input" not in {s.name for s in mine}  # asked while idle


async def test_one_trace_per_turn_with_its_activities_as_children(
        client, database_url, tmp_path, fake_anthropic):
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    exporter = InMemorySpanExporter()
    fake_anthropic.push(tool_use_message([("write_file", {"path": "a.txt", "content": "a"})]),
                        text_message("first"), text_message("second"))
    session_id = f"trace-{uuid.uuid4().hex[:8]}"
    try:
        interceptors = tracing_interceptors(settings, exporter=exporter)
        async with build_worker(client, settings, interceptors=interceptors):
            keel = KeelClient(client, settings.task_queue, settings)
            session = await keel.start_session(session_id)
            await session.ask("one")
            await session.ask("two")
        flush_tracing()
        spans = exporter.get_finished_spans()
    finally:
        shutdown_tracing()
    turns = sorted((s for s in spans if s.name == "Turn"
                    and s.attributes["keel.session_id"] == session_id),
                   key=lambda s: s.attributes["keel.turn"])
    assert [t.attributes["keel.turn"] for t in turns] == [1, 2]
    first = turns[0]
    assert first.attributes["keel.model"] and first.attributes["keel.tool_calls"] == 1
    assert first.attributes["keel.output_tokens"] > 0
    assert first.attributes["keel.cache_ttl"] == "5m"  # turns seconds apart
    assert first.parent is None  # a trace of its own
    in_trace = [s for s in spans if s.context.trace_id == first.context.trace_id]
    names = [s.name for s in in_trace]
    # Both model calls and the tool call of turn 1 are in its trace, under the turn.
    assert names.count("RunActivity:call_model") == 2, names
    assert names.count("RunActivity:run_tool") == 1, names
    starts = [s for s in in_trace if s.name.startswith("StartActivity:")]
    assert starts and all(s.parent.span_id == first.context.span_id for s in starts)
    assert turns[1].context.trace_id != first.context.trace_id


async def test_one_log_line_per_turn_with_its_figures(client, database_url, tmp_path,
                                                      fake_anthropic, log_stream):
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    settings.log_format = "json"
    configure_logging(settings, level="INFO", stream=log_stream)
    fake_anthropic.push(tool_use_message([("write_file", {"path": "a.txt", "content": "a"})]),
                        text_message("done"))
    session_id = f"log-{uuid.uuid4().hex[:8]}"
    async with build_worker(client, settings, interceptors=worker_interceptors(settings)):
        keel = KeelClient(client, settings.task_queue, settings)
        await (await keel.start_session(session_id)).ask("write a")
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines()
             if line.startswith("{")]
    turns = [line for line in lines if line["event"] == "turn ended"]
    assert len(turns) == 1
    turn = turns[0]
    assert turn["session_id"] == session_id and turn["run_id"] and turn["turn"] == 1
    assert turn["level"] == "info" and turn["model"]
    assert turn["tool_calls"] == 1 and turn["model_calls"] == 2
    assert turn["input_tokens"] > 0 and turn["output_tokens"] > 0
    assert turn["cache_ttl"] == "5m"
    assert "cached_tokens" in turn and turn["checkpoint"] is False
    assert turn["duration_s"] >= 0


async def test_a_checkpoint_logs_one_line_and_traces_its_steps(client, database_url, tmp_path,
                                                               fake_anthropic, log_stream):
    from keel.client import session_config
    from tests.checkpoint_model import MARKER, CheckpointModel, good_checkpoint

    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    settings.log_format = "json"
    configure_logging(settings, level="INFO", stream=log_stream)
    fake_anthropic.responder = CheckpointModel(good_checkpoint)
    filler = " ".join(f"w{i % 97}" for i in range(1_000))
    exporter = InMemorySpanExporter()
    session_id = f"cp-{uuid.uuid4().hex[:8]}"
    try:
        interceptors = [ActivityContextInterceptor(),
                        *tracing_interceptors(settings, exporter=exporter)]
        async with build_worker(client, settings, interceptors=interceptors):
            keel = KeelClient(client, settings.task_queue, settings)
            session = await keel.start_session(session_id, config=session_config(
                settings, context_window=12_000, max_output_tokens=512))
            for i in range(7):
                await session.ask(f"Part {i}: {filler}")
            assert (await session.status()).checkpoint_count >= 1
        flush_tracing()
        spans = exporter.get_finished_spans()
    finally:
        shutdown_tracing()
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines()
             if line.startswith("{")]
    stored = [line for line in lines if line["event"] == "checkpoint stored"]
    assert stored, [line["event"] for line in lines]
    line = stored[0]
    # Past the threshold by more than the margin, it may condense only the earlier part.
    assert line["session_id"] == session_id and line["kind"] in ("full", "earlier_part")
    assert line["tokens_after"] < line["tokens_before"]
    assert line["rounds"] >= 1 and line["repair"] is False and line["fallbacks"] == []
    turns = [t for t in lines if t["event"] == "turn ended"]
    assert len(turns) == 7 and any(t["checkpoint"] for t in turns)
    # Each checkpoint's line says what its requests cost, as the API counted them.
    said = [c for c in lines if c["event"] in ("checkpoint stored", "checkpoint failed")]
    theirs = [u for u, body in zip(fake_anthropic.usages, fake_anthropic.requests,
                                   strict=True)
              if MARKER in json.dumps(body) or "<keel:rollup" in json.dumps(body)]
    assert sum(c["output_tokens"] for c in said) == sum(u.output for u in theirs) > 0
    assert sum(c["input_tokens"] for c in said) == sum(
        u.input + u.cache_creation for u in theirs)
    checkpoint = next(s for s in spans if s.name == "Checkpoint"
                      and s.attributes["keel.session_id"] == session_id)
    assert checkpoint.attributes["keel.checkpoint_kind"] == line["kind"]
    assert checkpoint.attributes["keel.checkpoint_id"] == line["checkpoint_id"]
    # The span says what the checkpoint's requests cost, as its line does.
    assert {k: checkpoint.attributes[f"keel.{k}"] for k in (
        "input_tokens", "cached_tokens", "output_tokens", "usd")} == {
        k: line[k] for k in ("input_tokens", "cached_tokens", "output_tokens", "usd")}
    assert checkpoint.attributes["keel.output_tokens"] > 0
    steps = {s.name for s in spans if s.context.trace_id == checkpoint.context.trace_id}
    assert {"RunActivity:prepare_checkpoint", "RunActivity:checkpoint_round",
            "RunActivity:store_checkpoint"} <= steps, steps
    assert "RunActivity:call_model" not in steps  # the turn's own calls are in its trace
