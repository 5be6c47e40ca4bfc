"""A fake Anthropic Messages API on loopback, scripted per test.

The real `anthropic` SDK talks to it over HTTP, so retries, error mapping, tool use and
streaming go through the real client. Each request is first checked against the rules
the real API enforces (`strict`, on by default: a refused request is a 400 with the API's
wording); then it pops the next scripted step; when the script is empty, the `responder`
(if any) answers. Every request body is kept in `requests`; every answered request's
usage in `usages`; every refusal's message in `rejections`.

Usage is computed as the API does, prompt caching included (see `activities.offline.cache`): a step
whose `usage.input_tokens` is None gets input, cache-read and cache-write tokens from the
request; a step that sets `input_tokens` keeps the usage it gives.

Each step of handling a request (checking it, then accounting its usage once the script
or responder has answered) walks the body once, through a `PromptView`: the answers are
those of counting afresh at every question, as the responder may have changed the body
in between, and only the walk is shared.

An answer leaves at once: connections are kept alive and TCP_NODELAY is set on each, so
no answer waits on the client's delayed ACK (before, every kept-alive request after the
first few took ~40 ms more than its work, which every test and benchmark paid).
"""

from __future__ import annotations

import itertools
import json
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from activities.offline.accounting import Accounting
from activities.offline.blocks import PromptView, prompt_blocks, request_tokens
from activities.offline.cache import CacheUsage, PromptCache
from activities.offline.models import ModelLimits, limits_for
from tests.fake_anthropic.replies import DEFAULT_MODEL, ErrorStep
from tests.fake_anthropic.rules import check_request, check_size
from tests.fake_anthropic.stream import error_event, message_start, sse, stream_events

Responder = Callable[[dict[str, Any]], dict[str, Any]]
Step = dict[str, Any] | ErrorStep
_request_ids = itertools.count(1)


@dataclass
class StreamSeen:
    """One streamed reply as this server saw it: when it began, how many events it sent,
    and when the client closed it before the end (None: it ran to the end)."""

    request_id: str
    started: float
    events_sent: int = 0
    cancelled_at: float | None = None
    finished_at: float | None = None


@dataclass(frozen=True)
class Rejection:
    status: int
    message: str
    body: Any


class ManualClock:
    """A clock a test moves by hand: `FakeAnthropic(clock=clock)`, then `clock.advance(301)`
    to let a 5-minute cache entry expire."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Wait `seconds`; True as soon as the client has closed the connection."""
    readable, _, _ = select.select([sock], [], [], seconds)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that closed its keep-alive connection while the server waited for its
        next request (a worker or an SDK client stopping) is no error: a real server says
        nothing of it, where socketserver printed a traceback each time."""
        if isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
            return
        super().handle_error(request, client_address)


class FakeAnthropic:
    def __init__(self, responder: Responder | None = None, *, strict: bool = True,
                 context_window: int | None = None, max_output_tokens: int | None = None,
                 min_cacheable_tokens: int | None = None,
                 count_tool_definitions: bool = True, skew: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`strict`: refuse, as the API does, requests that break its rules. The three
        limits default to the requested model's (see `activities.offline.models`);
        `context_window` may also be set later as an attribute. `count_tool_definitions`:
        the tools' JSON (and the hidden tool-use prompt) count toward the prompt, as the API
        counts them. `skew`: this model's tokenizer counts that many times Keel's (a real
        model's differs by up to a fifth either way). `clock` drives cache TTLs (seconds)."""
        self.strict = strict
        self.context_window = context_window
        self.max_output_tokens = max_output_tokens
        self.min_cacheable_tokens = min_cacheable_tokens
        self.count_tool_definitions = count_tool_definitions
        self.skew = skew
        self.script: list[Step] = []
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self.usages: list[CacheUsage] = []
        self.rejections: list[Rejection] = []
        # Seconds between two streamed events (0: as fast as it can), so a test can stop a
        # reply mid-stream; every stream is kept in `streams`, its cancellation seen.
        self.stream_delay_s = 0.0
        self.streams: list[StreamSeen] = []
        self.connections = 0  # TCP connections accepted (keep-alive: one per client)
        self.cache = PromptCache(clock)
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), self._handler())
        # stop() waits for the serving loop to look at its flag, once a poll interval:
        # socketserver's default (0.5 s) was half a second of every test's teardown.
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        assert isinstance(host, str)  # an AF_INET socket's name (typed str | bytes)
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
        """Forget the script, the requests, the usages and the cache."""
        with self._lock:
            self.script.clear()
            self.requests.clear()
            self.usages.clear()
            self.rejections.clear()
            self.streams.clear()
            self.responder = responder
        self.cache.clear()

    def limits(self, body: dict[str, Any]) -> ModelLimits:
        base = limits_for(str(body.get("model", "")))
        return ModelLimits(
            context_window=self.context_window or base.context_window,
            max_output_tokens=self.max_output_tokens or base.max_output_tokens,
            min_cacheable_tokens=(self.min_cacheable_tokens if self.min_cacheable_tokens
                                  is not None else base.min_cacheable_tokens))

    @property
    def accounting(self) -> Accounting:
        """How this fake counts (read afresh: a test may change the attributes)."""
        return Accounting(skew=self.skew, count_tools=self.count_tool_definitions)

    def tokens(self, body: dict[str, Any]) -> int:
        """The whole prompt of `body`, as this fake counts it."""
        return request_tokens(body, self.accounting)

    def _refuse(self, body: Any, message: str) -> ErrorStep:
        with self._lock:
            self.rejections.append(Rejection(400, message, body))
        log = os.environ.get("FAKE_ANTHROPIC_REJECTIONS")
        if log:  # where a run of the suite lists every refusal, for review
            test = os.environ.get("PYTEST_CURRENT_TEST", "?")
            with open(log, "a") as out:
                out.write(json.dumps({"test": test, "message": message}) + "\n")
        return ErrorStep(400, "invalid_request_error", message)

    def _check(self, body: Any, *, count_tokens_endpoint: bool = False,
               view: PromptView | None = None) -> str | None:
        """`view`: the body's `PromptView`, if the caller will ask it more (same result)."""
        if view is None and isinstance(body, dict):
            view = PromptView(body, self.accounting)
        if self.strict:
            return check_request(
                body, self.limits,
                lambda b: view.tokens() if view else self.tokens(b),
                count_tokens_endpoint=count_tokens_endpoint,
                blocks_of=lambda b: view.blocks() if view
                else prompt_blocks(b, self.accounting))
        if self.context_window is not None and view is not None:  # set by the test
            return check_size(body, view.tokens(),
                              self.limits(body), count_tokens_endpoint=count_tokens_endpoint,
                              output_limit=False)
        return None

    def _next(self, body: dict[str, Any]) -> Step:
        with self._lock:
            self.requests.append(body)
        problem = self._check(body)
        if problem:
            return self._refuse(body, problem)
        with self._lock:
            if self.script:
                return self.script.pop(0)
            responder = self.responder
        if responder is None:
            return ErrorStep(500, message="fake server: script exhausted and no responder")
        try:
            return responder(body)
        except Exception as err:  # a broken test responder shows as a non-retryable error
            return ErrorStep(400, "invalid_request_error", f"fake responder failed: {err!r}")

    def _with_usage(self, body: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
        """The reply with its usage as the API would report it; the cache is read and
        written either way."""
        view = PromptView(body, self.accounting)  # afresh: the responder has had the body
        blocks = view.blocks()
        extra = view.tokens() - sum(
            b.tokens for b in blocks)
        counted = self.cache.account(body, blocks, self.limits(body).min_cacheable_tokens,
                                     extra_tokens=extra)
        given = dict(step.get("usage") or {})
        output = given.get("output_tokens")
        if output is None:  # a responder that leaves the count to the API: its blocks
            output = self.accounting.output([b for b in step.get("content") or []
                                             if isinstance(b, dict)])
        output = int(output)
        if given.get("input_tokens") is None:
            usage = CacheUsage(counted.cache_read, counted.cache_creation, counted.input,
                               output, counted.creation_5m, counted.creation_1h)
            given = {**usage.as_usage(), **{k: v for k, v in given.items()
                                            if k not in usage.as_usage() and v is not None}}
        else:
            given.setdefault("cache_creation_input_tokens", 0)
            given.setdefault("cache_read_input_tokens", 0)
            usage = CacheUsage(int(given.get("cache_read_input_tokens") or 0),
                               int(given.get("cache_creation_input_tokens") or 0),
                               int(given["input_tokens"]), output)
        with self._lock:
            self.usages.append(usage)
        reply = {**step, "usage": given}
        if reply.get("model") == DEFAULT_MODEL and isinstance(body.get("model"), str):
            reply["model"] = body["model"]  # the API names the model that was asked for
        return reply

    def count_tokens(self, body: Any) -> tuple[int, dict[str, Any]]:
        view = PromptView(body, self.accounting) if isinstance(body, dict) else None
        problem = self._check(body, count_tokens_endpoint=True, view=view)
        if problem:
            self._refuse(body, problem)
            return 400, ErrorStep(400, "invalid_request_error", problem).body("")
        return 200, {"input_tokens": view.tokens() if view else self.tokens(body)}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1 and keep-alive, as the API answers: a client's next request reuses
            # its connection (every answer has a length, or is chunked when streamed).
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Headers and body go out in two writes: with Nagle on, the body waited
                # for the client's delayed ACK of the headers (~40 ms on Linux) on every
                # request of a kept-alive connection after its first few.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with fake._lock:
                    fake.connections += 1

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, payload: dict[str, Any], request_id: str,
                      headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.send_header("request-id", request_id)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _error(self, step: ErrorStep, request_id: str) -> None:
                self._send(step.status, step.body(request_id), request_id, step.headers)

            def _stream(self, parts: Any, request_id: str) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream; charset=utf-8")
                self.send_header("cache-control", "no-cache")
                self.send_header("request-id", request_id)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                seen = StreamSeen(request_id, time.monotonic())
                with fake._lock:
                    fake.streams.append(seen)
                delay = fake.stream_delay_s
                try:
                    for part in parts:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                        self.wfile.flush()
                        seen.events_sent += 1
                        if delay and _closed_within(self.connection, delay):
                            seen.cancelled_at = time.monotonic()
                            break
                    else:
                        self.wfile.write(b"0\r\n\r\n")  # the end: the connection is kept
                        self.wfile.flush()
                        seen.finished_at = time.monotonic()
                        return
                except (BrokenPipeError, ConnectionResetError):
                    seen.cancelled_at = time.monotonic()
                self.close_connection = True  # cut off mid-stream: no next request here

            def do_POST(self) -> None:
                request_id = f"req_fake_{next(_request_ids):06d}"
                length = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(length) or b"{}"
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._error(ErrorStep(400, "invalid_request_error",
                                          "There was an error parsing the body of your"
                                          " request."), request_id)
                    return
                path = self.path.split("?", 1)[0].rstrip("/")
                if path == "/v1/messages/count_tokens":
                    status, payload = fake.count_tokens(body)
                    if status != 200:
                        payload["request_id"] = request_id
                    self._send(status, payload, request_id)
                    return
                if path != "/v1/messages":
                    self._error(ErrorStep(404, "not_found_error", f"Not found: {self.path}"),
                                request_id)
                    return
                step = fake._next(body)
                streaming = isinstance(body, dict) and body.get("stream") is True
                if isinstance(step, ErrorStep):
                    if streaming and step.mid_stream:
                        self._stream_error(body, step, request_id)
                    else:
                        self._error(step, request_id)
                    return
                step = fake._with_usage(body, step)
                if streaming:
                    self._stream(stream_events(step), request_id)
                else:
                    self._send(200, step, request_id)

            def _stream_error(self, body: dict[str, Any], step: ErrorStep,
                              request_id: str) -> None:
                started = {"id": f"msg_fake_{request_id}", "type": "message",
                           "role": "assistant", "model": body.get("model", "fake-model"),
                           "content": [], "stop_reason": None, "stop_sequence": None,
                           "usage": {"input_tokens": fake.tokens(body),
                                     "output_tokens": 1}}
                self._stream([message_start(started), sse("ping", {"type": "ping"}),
                              error_event(step.body(request_id))], request_id)

        return Handler
