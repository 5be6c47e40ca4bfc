"""The real model: the `anthropic` SDK over the Messages API, as a `ModelBackend`.

The SDK's own retries are off (`max_retries=0`) so Temporal owns retry: overloaded,
rate-limited, timed-out and 5xx calls raise a retryable error (honouring `retry-after`);
a request the API refuses (400, 401, 403, 404, 413, 422) is non-retryable, because the
same request would be refused again. A reply is checked before it is returned
(`checked_reply`), streamed or not: streaming changes nothing about the reply, and a
retried stream streams again from the start. The body is encoded here, once, as the SDK
encodes it (compact UTF-8 JSON), and posted through the SDK's client: its `messages.create`
and `.stream` would walk and copy the whole body twice first (its transform, then its
request preparation), which costs as much CPU as the encoding again and grows with the
window (~10 ms a call at 600 KB). The post carries the span options `messages.create`
gives, so with a tracer provider set the SDK still records its call span and sends its
trace context (`call_span`). This module knows nothing of the offline model
(`activities.offline`); the worker's `ModelBackends` chooses between the two.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any, cast

import anthropic
from anthropic import RequestOptions
from anthropic.lib.streaming import AsyncMessageStreamManager
from anthropic.types import Message, RawMessageStreamEvent
from temporalio.exceptions import ApplicationError

from activities.model.backend import RETRYABLE_STATUS, api_refusal, safe_on_text
from schemas.config import ModelSettings
from schemas.model import (
    MODEL_CONNECTION,
    MODEL_ERROR,
    MODEL_MALFORMED_REPLY,
    MODEL_TIMEOUT,
)

__all__ = ["RETRYABLE_STATUS", "AnthropicBackend", "checked_reply", "encoded_body",
           "model_error"]

_ClientKey = tuple[str | None, str | None, float]
MESSAGES_PATH = "/v1/messages"
# As the SDK's own encoder: compact, UTF-8, no NaN (a request is plain JSON values).
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def encoded_body(request: dict[str, Any], *, stream: bool) -> bytes:
    """A Messages API request's body (a plain dict: model, system, messages, tools); a
    request that is not JSON (a value JSON cannot hold, text UTF-8 cannot) is a
    non-retryable error: the same request would fail again."""
    try:
        return _ENCODER.encode({**request, "stream": True} if stream else request).encode()
    except (TypeError, ValueError) as err:  # UnicodeEncodeError is a ValueError
        raise ApplicationError(f"the model request cannot be sent as JSON: {err}",
                               type=MODEL_ERROR, non_retryable=True) from err


def call_span(request: dict[str, Any]) -> RequestOptions:
    """The SDK's own call span, as `messages.create` names it: with a tracer provider set,
    the SDK records the call (its usage from the response) and sends its trace context; a
    bare `post` makes none. Its request attributes are given here (the body goes encoded,
    so the SDK cannot read them from it)."""
    attributes = {name: request[key] for name, key in (
        ("gen_ai.request.model", "model"), ("gen_ai.request.max_tokens", "max_tokens"))
        if isinstance(request.get(key), str | int)}
    return cast(RequestOptions, {"span_name": "anthropic.messages.create",
                                 "span_route": MESSAGES_PATH, "span_attributes": attributes})


class AnthropicBackend:
    """The Messages API through the SDK; one client per (base URL, key, timeout)."""

    def __init__(self) -> None:
        self._clients: dict[_ClientKey, anthropic.AsyncAnthropic] = {}

    def _client(self, settings: ModelSettings) -> anthropic.AsyncAnthropic:
        key = (settings.base_url, settings.api_key, settings.request_timeout_s)
        client = self._clients.get(key)
        if client is None:
            client = anthropic.AsyncAnthropic(
                api_key=settings.api_key or "keel-no-key",
                base_url=settings.base_url,
                max_retries=0,
                timeout=settings.request_timeout_s,
            )
            self._clients[key] = client
        return client

    async def aclose(self) -> None:
        """Close every client and its connections (a later request opens a new one)."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    async def create(self, settings: ModelSettings, request: dict[str, Any]) -> Message:
        """Send one Messages API request (a plain dict: model, system, messages, tools)."""
        try:
            message = await self._client(settings).post(
                MESSAGES_PATH, cast_to=Message, content=encoded_body(request, stream=False),
                options=call_span(request))
        except anthropic.APIError as err:
            raise model_error(err) from err
        return checked_reply(message)

    async def stream(self, settings: ModelSettings, request: dict[str, Any],
                     on_text: Callable[[str], None]) -> Message:
        """The same request streamed: its text to `on_text` as the SDK produces it."""
        events = self._client(settings).post(
            MESSAGES_PATH, cast_to=Message, content=encoded_body(request, stream=True),
            options=call_span(request), stream=True,
            stream_cls=anthropic.AsyncStream[RawMessageStreamEvent])
        try:
            async with AsyncMessageStreamManager(events) as stream:
                async for text in stream.text_stream:
                    safe_on_text(on_text, text)
                message = await stream.get_final_message()
        except anthropic.APIError as err:
            raise model_error(err) from err
        return checked_reply(message)


def _retry_after(err: anthropic.APIStatusError) -> timedelta | None:
    value = err.response.headers.get("retry-after") if err.response is not None else None
    try:
        return timedelta(seconds=float(value)) if value else None
    except ValueError:
        return None


def model_error(err: Exception) -> ApplicationError:
    """Map an SDK error to a Temporal error that says whether a retry can help."""
    if isinstance(err, anthropic.APIStatusError):
        return api_refusal(err.status_code, err.message,
                           _retry_after(err) if err.status_code in RETRYABLE_STATUS
                           or err.status_code >= 500 else None)
    if isinstance(err, anthropic.APITimeoutError):
        return ApplicationError(f"model API timed out: {err}", type=MODEL_TIMEOUT)
    if isinstance(err, anthropic.APIConnectionError):
        return ApplicationError(f"model API unreachable: {err}", type=MODEL_CONNECTION)
    return ApplicationError(f"model call failed: {err!r}", type=MODEL_ERROR,
                            non_retryable=True)


def checked_reply(message: Message) -> Message:
    """A reply Keel can use, or a non-retryable error saying what is wrong with it.

    The SDK builds a Message without validating the server's JSON; a malformed reply would
    otherwise fail later as a bare TypeError, which Temporal retries for as long as it may.
    """
    problems = []
    if not isinstance(message.content, list):
        problems.append("no content list")
    else:
        for block in message.content:
            kind = getattr(block, "type", None)
            if kind == "tool_use" and not (getattr(block, "id", None)
                                           and getattr(block, "name", None)):
                problems.append("a tool_use block without id or name")
            if kind == "text" and not isinstance(getattr(block, "text", None), str):
                problems.append("a text block without text")
    if getattr(message, "usage", None) is None:
        problems.append("no usage")
    if not isinstance(getattr(message, "model", None), str):
        problems.append("no model")
    if problems:
        raise ApplicationError(f"malformed model reply: {'; '.join(problems)}",
                               type=MODEL_MALFORMED_REPLY, non_retryable=True)
    return message
