"""The offline model as a `ModelBackend`: the rules of `activities.offline.model`, no network.

Invariants: the reply is exactly what the rules return for the request; streamed, its
whole text goes to `on_text` as one fragment per text block. It counts and refuses as the
Messages API does (`activities.offline.accounting`): its usage is the API's count of the
request at the settings' tokenizer skew (`offline_token_skew`), and a prompt past the
settings' window (`context_window`, which the caller sets to the session's) is refused
with the API's words and the error the real backend raises for them; a reply longer than
`max_tokens` ends there, as the API ends it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from anthropic.types import Message

from activities.model.backend import api_refusal, safe_on_text
from activities.offline.accounting import Accounting, context_problem
from activities.offline.model import respond
from schemas.config import ModelSettings

__all__ = ["OfflineBackend"]


class OfflineBackend:
    """Answers every request by rule, counted and refused as the API would."""

    async def aclose(self) -> None:
        """Nothing is held open."""

    async def create(self, settings: ModelSettings, request: dict[str, Any]) -> Message:
        accounting = Accounting(skew=settings.offline_token_skew)
        prompt = accounting.request(request)
        problem = context_problem(prompt, int(request.get("max_tokens") or 0),
                                  settings.context_window)
        if problem is not None:
            raise api_refusal(400, problem)
        reply = respond(request)
        reply["content"], cut = accounting.clip(reply["content"],
                                                int(request.get("max_tokens") or 0))
        if cut:  # the API stops at max_tokens, whatever the rules had to say
            reply["stop_reason"] = "max_tokens"
        reply["usage"] = {"input_tokens": prompt,
                          "output_tokens": accounting.output(reply["content"])}
        return Message.model_validate(reply)

    async def stream(self, settings: ModelSettings, request: dict[str, Any],
                     on_text: Callable[[str], None]) -> Message:
        message = await self.create(settings, request)
        for block in message.content:
            if block.type == "text" and block.text:
                safe_on_text(on_text, block.text)
        return message
