"""A fake Anthropic Messages API on loopback, scripted per test.

The real `anthropic` SDK talks to it over HTTP, so retries, error mapping and tool use go
through the real client. Each request pops the next scripted step; when the script is
empty, the `responder` (if any) answers. Every request body is kept for assertions.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[dict[str, Any]], dict[str, Any]]
_ids = itertools.count(1)


def request_tokens(body: dict[str, Any]) -> int:
    """What a real API would count for this request, near enough: the same encoding Keel
    estimates with, over the system prompt, every block's text and every tool input."""
    from schemas.tokens import count_tokens

    parts = [body.get("system") if isinstance(body.get("system"), str) else ""]
    for m in body.get("messages", []):
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
            continue
        for b in content or []:
            if b.get("type") == "text":
                parts.append(b["text"])
            elif b.get("type") == "tool_use":
                parts.append(json.dumps(b.get("input", {})))
            elif b.get("type") == "tool_result":
                parts.append(str(b.get("content", "")))
    return sum(count_tokens(p) for p in parts if p) + 4 * len(body.get("messages", []))


def text_message(text: str, *, model: str = "fake-model", input_tokens: int | None = None,
                 output_tokens: int = 5, stop_reason: str = "end_turn") -> dict[str, Any]:
    return {
        "id": f"msg_fake_{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def tool_use_message(calls: list[tuple[str, dict[str, Any]]], *, text: str = "",
                     model: str = "fake-model", input_tokens: int | None = None,
                     ) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for name, args in calls:
        content.append(
            {"type": "tool_use", "id": f"toolu_fake_{next(_ids)}", "name": name, "input": args}
        )
    return {
        "id": f"msg_fake_{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 20},
    }


@dataclass
class ErrorStep:
    status: int
    error_type: str = "api_error"
    message: str = "scripted error"
    headers: dict[str, str] = field(default_factory=dict)


Step = dict[str, Any] | ErrorStep


class FakeAnthropic:
    def __init__(self, responder: Responder | None = None) -> None:
        # Like the real API: a request whose input and output cannot fit is refused (400).
        self.context_window: int | None = None
        self.script: list[Step] = []
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeAnthropic:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def push(self, *steps: Step) -> None:
        with self._lock:
            self.script.extend(steps)

    def reset(self, responder: Responder | None = None) -> None:
        with self._lock:
            self.script.clear()
            self.requests.clear()
            self.responder = responder

    def _next(self, body: dict[str, Any]) -> Step:
        if self.context_window is not None:
            size = request_tokens(body) + int(body.get("max_tokens", 0))
            if size > self.context_window:
                with self._lock:
                    self.requests.append(body)
                return ErrorStep(400, "invalid_request_error",
                                 f"prompt is too long: {size} tokens > {self.context_window}")
        with self._lock:
            self.requests.append(body)
            if self.script:
                return self.script.pop(0)
            responder = self.responder
        if responder is None:
            return ErrorStep(500, message="fake server: script exhausted and no responder")
        try:
            return responder(body)
        except Exception as err:  # a broken test responder shows as a non-retryable error
            return ErrorStep(400, "invalid_request_error", f"fake responder failed: {err!r}")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: dict[str, Any],
                      headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.startswith("/v1/messages"):
                    self._send(404, {"type": "error", "error": {"type": "not_found_error",
                                                               "message": self.path}})
                    return
                step = fake._next(body)
                if isinstance(step, ErrorStep):
                    self._send(step.status, {"type": "error", "error": {
                        "type": step.error_type, "message": step.message}}, step.headers)
                else:
                    if step.get("usage", {}).get("input_tokens") is None:
                        step = {**step, "usage": {**step["usage"],
                                                  "input_tokens": request_tokens(body)}}
                    self._send(200, step)

        return Handler
