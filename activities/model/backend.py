"""What a model call needs from a model: the backend protocol, and the choice between two.

Invariant: a request and its reply are plain Messages API shapes (a request dict in, an
`anthropic.types.Message` out) whichever backend answers. A backend's `stream` returns the
same reply as its `create`, handing the reply's text to `on_text` as it comes: a live view
only, called with each fragment in order, its failures swallowed (`safe_on_text`).

Which backend answers a request is decided by its model settings alone, exactly as
`ModelSettings.offline` says (no API key and no base URL: the offline model). The chooser,
`ModelBackends`, is built once by the worker, which is the only place that imports the
offline model; the real adapter never does. Which model a request names is decided here
too, on an activity's retries: from `FALLBACK_FROM_ATTEMPT` on, the settings' fallback
model, when they name one (schemas.model.model_for_attempt).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from anthropic.types import Message
from temporalio import activity
from temporalio.exceptions import ApplicationError

from schemas.config import ModelSettings
from schemas.model import (
    FALLBACK_FROM_ATTEMPT,
    PROMPT_TOO_LONG,
    http_error_type,
    model_for_attempt,
    too_long,
)

__all__ = ["RETRYABLE_STATUS", "ModelBackend", "ModelBackends", "api_refusal", "attempt_now",
           "for_attempt", "safe_on_text"]

RETRYABLE_STATUS = {408, 409, 429, 500, 502, 503, 504, 529}

log = logging.getLogger(__name__)


class ModelBackend(Protocol):
    """One way to answer Messages API requests."""

    async def create(self, settings: ModelSettings, request: dict[str, Any]) -> Message:
        """Send one request (a plain dict: model, system, messages, tools, ...)."""
        ...

    async def stream(self, settings: ModelSettings, request: dict[str, Any],
                     on_text: Callable[[str], None]) -> Message:
        """Send one request with streaming; returns the complete reply."""
        ...

    async def aclose(self) -> None:
        """Close what it holds open (connections); called once, when its worker stops."""
        ...


def api_refusal(status: int, message: str,
                retry_after: timedelta | None = None) -> ApplicationError:
    """The error a backend raises for an API answer of `status`: retryable for overload,
    rate limits and 5xx; else non-retryable (the same request would be refused again). A
    prompt refused as too long is its own type (`PROMPT_TOO_LONG`) with the API's count
    in its details, so the session makes room instead of failing."""
    retryable = status in RETRYABLE_STATUS or status >= 500
    refused = too_long(status, message)
    if refused is not None:
        return ApplicationError(f"model API answered {status}: {message}",
                                refused.prompt_tokens, refused.maximum,
                                type=PROMPT_TOO_LONG, non_retryable=True)
    return ApplicationError(f"model API answered {status}: {message}",
                            type=http_error_type(status), non_retryable=not retryable,
                            next_retry_delay=retry_after if retryable else None)


def safe_on_text(on_text: Callable[[str], None], text: str) -> None:
    """Hand `text` to the live view; a failing view never costs the reply."""
    try:
        on_text(text)
    except Exception as err:  # the live view must never cost the reply
        log.warning("on_text failed: %r", err)


@dataclass(frozen=True)
class ModelBackends:
    """The real backend and the offline one, chosen per request by its settings' profile.

    It is a `ModelBackend` itself, so a caller that is given it asks it like any backend.
    """

    real: ModelBackend
    offline: ModelBackend
    # model -> until when (monotonic) this worker asks its fallback first (`for_attempt`)
    held: dict[str, float] = field(default_factory=dict)

    def for_settings(self, settings: ModelSettings) -> ModelBackend:
        return self.offline if settings.offline else self.real

    async def create(self, settings: ModelSettings, request: dict[str, Any]) -> Message:
        return await self.for_settings(settings).create(
            settings, for_attempt(settings, request, self.held))

    async def stream(self, settings: ModelSettings, request: dict[str, Any],
                     on_text: Callable[[str], None]) -> Message:
        return await self.for_settings(settings).stream(
            settings, for_attempt(settings, request, self.held), on_text)

    async def aclose(self) -> None:
        await self.real.aclose()
        await self.offline.aclose()


def attempt_now() -> int:
    """This activity's attempt (1 outside an activity: a benchmark's direct call)."""
    return activity.info().attempt if activity.in_activity() else 1


def for_attempt(settings: ModelSettings, request: dict[str, Any],
                held: dict[str, float]) -> dict[str, Any]:
    """`request` naming the model this attempt asks: its own, or the fallback. An attempt
    that turns to the fallback holds it for the model (`held`, the worker's) for
    `settings.fallback_hold_s`."""
    asked = request.get("model")
    if not settings.fallback_model or not isinstance(asked, str):
        return request
    now, attempt = time.monotonic(), attempt_now()
    if attempt >= FALLBACK_FROM_ATTEMPT:
        held[asked] = now + settings.fallback_hold_s
    model = model_for_attempt(asked, settings.fallback_model, attempt,
                              held=held.get(asked, 0.0) > now)
    return request if model == asked else {**request, "model": model}
