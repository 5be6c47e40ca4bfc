"""The streamed model call against a loopback server speaking the Messages API's SSE: the
fragments spell out the text, the final reply is complete, errors map as unstreamed."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.model import AnthropicBackend, ModelBackends
from activities.offline import OfflineBackend
from schemas.config import KeelSettings, ModelSettings

FRAGMENTS = ["Reviewed ", "PR #101: ", "approve."]


def _events() -> list[dict[str, Any]]:
    start: dict[str, Any] = {
        "id": "msg_s1", "type": "message", "role": "assistant", "model": "fake",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 1}}
    out: list[dict[str, Any]] = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "text", "text": ""}}]
    out += [{"type": "content_block_delta", "index": 0,
             "delta": {"type": "text_delta", "text": t}} for t in FRAGMENTS]
    out += [{"type": "content_block_stop", "index": 0},
            {"type": "content_block_start", "index": 1, "content_block": {
                "type": "tool_use", "id": "toolu_1", "name": "write_file", "input": {}}},
            {"type": "content_block_delta", "index": 1, "delta": {
                "type": "input_json_delta", "partial_json": '{"path": "r.md", '}},
            {"type": "content_block_delta", "index": 1, "delta": {
                "type": "input_json_delta", "partial_json": '"content": "ok"}'}},
            {"type": "content_block_stop", "index": 1},
            {"type": "message_delta", "delta": {"stop_reason": "tool_use",
                                                "stop_sequence": None},
             "usage": {"output_tokens": 30}},
            {"type": "message_stop"}]
    return out


class _Server:
    def __init__(self) -> None:
        self.status = 200
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                if server.status != 200:
                    data = json.dumps({"type": "error", "error": {
                        "type": "overloaded_error", "message": "busy"}}).encode()
                    self.send_response(server.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for event in _events():
                    self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
                                     .encode())
                    self.wfile.flush()

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, kwargs={"poll_interval": 0.02},
                         daemon=True).start()  # shutdown() waits one poll interval

    @property
    def settings(self) -> ModelSettings:
        host, port = self.http.server_address[:2]
        assert isinstance(host, str)  # an AF_INET socket's name: never bytes
        return ModelSettings(base_url=f"http://{host}:{port}", api_key="k", request_timeout_s=10)


@pytest.fixture
def sse():
    server = _Server()
    yield server
    server.http.shutdown()
    server.http.server_close()


REQUEST = {"model": "fake", "max_tokens": 100, "messages": [{"role": "user", "content": "go"}]}


async def test_fragments_spell_the_text_and_the_reply_is_complete(sse) -> None:
    seen: list[str] = []
    message = await AnthropicBackend().stream(sse.settings, REQUEST, seen.append)
    assert seen == FRAGMENTS
    assert message.content[0].text == "".join(FRAGMENTS)  # type: ignore[union-attr]
    tool = message.content[1]
    assert tool.type == "tool_use" and tool.input == {"path": "r.md", "content": "ok"}
    assert message.stop_reason == "tool_use" and message.usage.output_tokens == 30


async def test_a_failing_on_text_costs_nothing(sse) -> None:
    def broken(_: str) -> None:
        raise RuntimeError("publisher gone")

    message = await AnthropicBackend().stream(sse.settings, REQUEST, broken)
    assert message.content[0].text == "".join(FRAGMENTS)  # type: ignore[union-attr]


async def test_errors_map_as_unstreamed(sse) -> None:
    sse.status = 529
    with pytest.raises(ApplicationError) as err:
        await AnthropicBackend().stream(sse.settings, REQUEST, lambda _: None)
    assert err.value.type == "ModelHTTP529" and not err.value.non_retryable


async def test_the_offline_model_streams_its_text_once() -> None:
    seen: list[str] = []
    message = await OfflineBackend().stream(ModelSettings(), {**REQUEST, "system": "s"},
                                            seen.append)
    texts = [b.text for b in message.content if b.type == "text"]
    assert seen == [t for t in texts if t]


def test_the_backend_is_chosen_by_the_settings_profile() -> None:
    real, offline = AnthropicBackend(), OfflineBackend()
    backends = ModelBackends(real=real, offline=offline)
    keyed = KeelSettings(model=ModelSettings(api_key="k"))
    assert backends.for_settings(ModelSettings()) is offline  # no key, no base URL
    assert backends.for_settings(ModelSettings(base_url="http://127.0.0.1:1")) is real
    assert backends.for_settings(keyed.model) is real
    assert backends.for_settings(keyed.model_for("offline")) is offline


async def test_closing_the_backend_closes_its_clients(sse) -> None:
    """A worker that stops closes the SDK clients its model calls opened (their
    connections), instead of leaving them to the collector."""
    backend = AnthropicBackend()
    await backend.stream(sse.settings, REQUEST, lambda _: None)
    (client,) = backend._clients.values()
    assert not client.is_closed()
    await ModelBackends(real=backend, offline=OfflineBackend()).aclose()
    assert client.is_closed() and backend._clients == {}
    # A request after it opens a client again.
    message = await backend.stream(sse.settings, REQUEST, lambda _: None)
    assert message.content[0].text == "".join(FRAGMENTS)  # type: ignore[union-attr]
    await backend.aclose()
