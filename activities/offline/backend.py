"""The offline model as a `ModelBackend`: the rules of `activities.offline.model`, no network.

Invariant: the reply is exactly what the rules return for the request, whatever the
settings; streamed, its whole text goes to `on_text` as one fragment per text block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from anthropic.types import Message

from activities.model.backend import safe_on_text
from activities.offline.model import respond
from schemas.config import ModelSettings

__all__ = ["OfflineBackend"]


class OfflineBackend:
    """Answers every request by rule (the settings are not read)."""

    async def create(self, settings: ModelSettings, request: dict[str, Any]) -> Message:
        return Message.model_validate(respond(request))

    async def stream(self, settings: ModelSettings, request: dict[str, Any],
                     on_text: Callable[[str], None]) -> Message:
        message = await self.create(settings, request)
        for block in message.content:
            if block.type == "text" and block.text:
                safe_on_text(on_text, block.text)
        return message
