"""The model call, streamed: the same request and reply as `activities.model.create_message`,
with the reply's text handed to `on_text` as the SDK produces it.

Invariant: streaming changes nothing about the reply. The returned `Message` is the SDK's
final message, checked by `checked_reply`; errors map through `model_error` exactly as the
unstreamed call's do (Temporal owns retries). `on_text` is a live view only: it is called
with each text fragment in order, its failures are swallowed, and a retried call streams
again from the start. The offline model streams its whole text as one fragment.

In the model activity (SessionActivities.call_model), in place of `create_message`:

    async with DeltaPublisher.for_activity(data.session_id, data.turn, data.reply_seq) as d:
        message = await _with_heartbeat(stream_message(self.settings.model, request, d.add))
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anthropic
from anthropic.types import Message

from activities.model import _client, checked_reply, model_error
from schemas.config import ModelSettings

log = logging.getLogger(__name__)


def _safe(on_text: Callable[[str], None], text: str) -> None:
    try:
        on_text(text)
    except Exception as err:  # the live view must never cost the reply
        log.warning("on_text failed: %r", err)


async def stream_message(settings: ModelSettings, request: dict[str, Any],
                         on_text: Callable[[str], None]) -> Message:
    """Send one Messages API request with streaming; returns the complete reply."""
    if settings.offline:
        from activities.offline_model import respond

        message = Message.model_validate(respond(request))
        for block in message.content:
            if block.type == "text" and block.text:
                _safe(on_text, block.text)
        return message
    try:
        async with _client(settings).messages.stream(**request) as stream:
            async for text in stream.text_stream:
                _safe(on_text, text)
            message = await stream.get_final_message()
    except anthropic.APIError as err:
        raise model_error(err) from err
    return checked_reply(message)
