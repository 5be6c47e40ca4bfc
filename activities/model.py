"""The one adapter over the Messages API: the real `anthropic` SDK, or the offline model.

The SDK's own retries are off (`max_retries=0`) so Temporal owns retry: overloaded,
rate-limited, timed-out and 5xx calls raise a retryable error (honouring `retry-after`);
a request the API refuses (400, 401, 403, 404, 413, 422) is non-retryable, because the
same request would be refused again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from contextlib import suppress
from datetime import timedelta
from typing import Any, TypeVar

import anthropic
from anthropic.types import Message
from temporalio import activity
from temporalio.exceptions import ApplicationError

from schemas.config import ModelSettings
from schemas.model import (
    MODEL_CONNECTION,
    MODEL_ERROR,
    MODEL_MALFORMED_REPLY,
    MODEL_TIMEOUT,
    http_error_type,
)

T = TypeVar("T")
# Beats per heartbeat timeout: a worker must miss several before Temporal gives up on it.
BEATS_PER_TIMEOUT = 4
DEFAULT_BEAT_S = 5.0

RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504, 529}

_clients: dict[tuple[str | None, str | None, float], anthropic.AsyncAnthropic] = {}


def _client(settings: ModelSettings) -> anthropic.AsyncAnthropic:
    key = (settings.base_url, settings.api_key, settings.request_timeout_s)
    client = _clients.get(key)
    if client is None:
        client = anthropic.AsyncAnthropic(
            api_key=settings.api_key or "keel-no-key",
            base_url=settings.base_url,
            max_retries=0,
            timeout=settings.request_timeout_s,
        )
        _clients[key] = client
    return client


def _retry_after(err: anthropic.APIStatusError) -> timedelta | None:
    value = err.response.headers.get("retry-after") if err.response is not None else None
    try:
        return timedelta(seconds=float(value)) if value else None
    except ValueError:
        return None


def model_error(err: Exception) -> ApplicationError:
    """Map an SDK error to a Temporal error that says whether a retry can help."""
    if isinstance(err, anthropic.APIStatusError):
        status = err.status_code
        retryable = status in RETRYABLE_STATUS or status >= 500
        return ApplicationError(
            f"model API answered {status}: {err.message}",
            type=http_error_type(status),
            non_retryable=not retryable,
            next_retry_delay=_retry_after(err) if retryable else None,
        )
    if isinstance(err, anthropic.APITimeoutError):
        return ApplicationError(f"model API timed out: {err}", type=MODEL_TIMEOUT)
    if isinstance(err, anthropic.APIConnectionError):
        return ApplicationError(f"model API unreachable: {err}", type=MODEL_CONNECTION)
    return ApplicationError(f"model call failed: {err!r}", type=MODEL_ERROR,
                            non_retryable=True)


async def create_message(settings: ModelSettings, request: dict[str, Any]) -> Message:
    """Send one Messages API request (a plain dict: model, system, messages, tools, ...).

    With no API key and no base URL, the offline deterministic model answers instead.
    """
    if settings.offline:
        from activities.offline_model import respond

        return Message.model_validate(respond(request))
    try:
        message = await _client(settings).messages.create(**request)
    except anthropic.APIError as err:
        raise model_error(err) from err
    return checked_reply(message)


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


def beat_interval() -> float:
    """A quarter of this activity's heartbeat timeout (as the SDK's openai_agents does)."""
    timeout = activity.info().heartbeat_timeout
    if not timeout:
        return DEFAULT_BEAT_S
    return max(0.1, timeout.total_seconds() / BEATS_PER_TIMEOUT)


async def with_heartbeat(awaitable: Awaitable[T]) -> T:
    """Await a long call while telling Temporal the activity is alive."""
    task = asyncio.ensure_future(awaitable)
    interval = beat_interval()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                return task.result()
            with suppress(RuntimeError):
                activity.heartbeat()
    finally:
        if not task.done():
            task.cancel()
