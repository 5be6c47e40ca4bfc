"""What a model call needs from a model: the backend protocol, and the choice between two.

Invariant: a request and its reply are plain Messages API shapes (a request dict in, an
`anthropic.types.Message` out) whichever backend answers. A backend's `stream` returns the
same reply as its `create`, handing the reply's text to `on_text` as it comes: a live view
only, called with each fragment in order, its failures swallowed (`safe_on_text`).

Which backend answers a request is decided by its model settings alone, exactly as
`ModelSettings.offline` says (no API key and no base URL: the offline model). The chooser,
`ModelBackends`, is built once by the worker, which is the only place that imports the
offline model; the real adapter never does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from anthropic.types import Message

from schemas.config import ModelSettings

__all__ = ["ModelBackend", "ModelBackends", "safe_on_text"]

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

    def for_settings(self, settings: ModelSettings) -> ModelBackend:
        return self.offline if settings.offline else self.real

    async def create(self, settings: ModelSettings, request: dict[str, Any]) -> Message:
        return await self.for_settings(settings).create(settings, request)

    async def stream(self, settings: ModelSettings, request: dict[str, Any],
                     on_text: Callable[[str], None]) -> Message:
        return await self.for_settings(settings).stream(settings, request, on_text)
