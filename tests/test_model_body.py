"""The body Keel posts is the one the SDK's own `messages.create` / `.stream` would send
(Keel encodes it once itself, activities.model.anthropic_backend), read off the wire of a
loopback server; a request that is not JSON is refused, not retried."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import pytest
from temporalio.exceptions import ApplicationError

from activities.model import AnthropicBackend
from activities.model.anthropic_backend import MESSAGES_PATH, call_span, encoded_body
from schemas.config import ModelSettings

REPLY = {"id": "msg_1", "type": "message", "role": "assistant", "model": "fake",
         "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
         "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 1}}
STREAM: list[dict[str, Any]] = [
    {"type": "message_start", "message": {**REPLY, "content": [], "stop_reason": None}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
     "usage": {"output_tokens": 1}},
    {"type": "message_stop"}]

REQUEST: dict[str, Any] = {
    "model": "claude-sonnet-4-5", "max_tokens": 512,
    "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Résumé, 日本語, \U0001f600"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                           "name": "read_file", "input": {"path": "a.md"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "line\n\ttab \"quoted\"", "is_error": False},
                                     {"type": "text", "text": "go on"}]}],
    "tools": [{"name": "read_file", "description": "Read a file.",
               "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                                "required": ["path"]}}]}


@pytest.fixture
def wire() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    """A loopback Messages API that keeps every request's headers and raw body."""
    seen: list[tuple[dict[str, str], bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            seen.append(({k.lower(): v for k, v in self.headers.items()}, body))
            if json.loads(body).get("stream"):
                data = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"
                               for e in STREAM).encode()
                kind = "text/event-stream"
            else:
                data, kind = json.dumps(REPLY).encode(), "application/json"
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


async def test_the_body_is_the_sdks_own(wire) -> None:
    url, seen = wire
    sdk = anthropic.AsyncAnthropic(api_key="x", base_url=url, max_retries=0)
    await sdk.messages.create(**REQUEST)
    async with sdk.messages.stream(**REQUEST) as stream:
        await stream.get_final_message()
    settings = ModelSettings(name="fake", base_url=url, api_key="x", request_timeout_s=30)
    backend = AnthropicBackend()
    reply = await backend.create(settings, REQUEST)
    streamed: list[str] = []
    final = await backend.stream(settings, REQUEST, streamed.append)
    assert reply.content[0].text == "ok" and final.content[0].text == "ok"  # type: ignore[union-attr]
    assert streamed == ["ok"]
    (sdk_create, sdk_stream, create, stream_) = seen
    for ours, theirs in ((create, sdk_create), (stream_, sdk_stream)):
        assert json.loads(ours[1]) == json.loads(theirs[1])
        assert ours[0]["content-type"] == theirs[0]["content-type"] == "application/json"
        assert ours[0]["anthropic-version"] == theirs[0]["anthropic-version"]
        assert ours[0]["authorization"] == theirs[0]["authorization"] == "Bearer x"
        # The same headers but the SDK's own telemetry (its helper's name, its timeout).
        names = {k for k in theirs[0] if not k.startswith("x-stainless")}
        assert names <= set(ours[0])
        # As compact as the SDK's, and UTF-8 as it is, not \\u escapes.
        assert len(ours[1]) == len(theirs[1])
        assert "日本語".encode() in ours[1]
    assert "stream" not in json.loads(create[1]) and json.loads(stream_[1])["stream"] is True


async def test_the_call_is_the_sdks_own_span(wire) -> None:
    """With a tracer provider, Keel's post makes the span `messages.create` makes: its
    name, the request's model, the response's usage; and sends its trace context."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    url, seen = wire
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    sdk = anthropic.AsyncAnthropic(api_key="x", base_url=url, max_retries=0,
                                   open_telemetry={"tracer_provider": provider})
    await sdk.messages.create(**REQUEST)
    await sdk.post(MESSAGES_PATH, cast_to=anthropic.types.Message,
                   content=encoded_body(REQUEST, stream=False), options=call_span(REQUEST))
    theirs, ours = spans.get_finished_spans()
    assert ours.name == theirs.name == "anthropic.messages.create"
    mine, sdks = dict(ours.attributes or {}), dict(theirs.attributes or {})
    for key in ("gen_ai.request.model", "gen_ai.request.max_tokens",
                "gen_ai.usage.output_tokens", "gen_ai.response.id"):
        assert key in sdks and mine.get(key) == sdks[key], key
    assert "traceparent" in seen[0][0] and "traceparent" in seen[1][0]


@pytest.mark.parametrize("bad", [float("nan"), "\ud800 lone surrogate", {1, 2}])
def test_a_request_that_is_not_json_is_refused_for_good(bad: Any) -> None:
    with pytest.raises(ApplicationError, match="cannot be sent as JSON") as raised:
        encoded_body({**REQUEST, "metadata": {"x": bad}}, stream=False)
    assert raised.value.non_retryable
