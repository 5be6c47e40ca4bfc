"""The offline model as a `ModelBackend`: the rules of `activities.offline.model`, no network.

Invariants: the reply is exactly what the rules return for the request; streamed, its
whole text goes to `on_text` as one fragment per text block. It counts, caches and refuses
as the Messages API does, by the copies of those rules the test fake uses
(`activities.offline.accounting`, `blocks`, `cache`, `models`): its usage is the API's
count of the request at the settings' tokenizer skew (`offline_token_skew`), split into
cache reads, cache writes and uncached input by the request's breakpoints against what
this backend's earlier requests wrote (one cache per worker process, its entries kept for
their TTL as the API keeps them; the API's is one per organisation), and a prompt past the
settings' window (`context_window`, which the caller sets to the session's) is refused
with the API's words and the error the real backend raises for them, reading and writing
no cache; a reply longer than `max_tokens` ends there, as the API ends it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from anthropic.types import Message

from activities.model.backend import api_refusal, safe_on_text
from activities.offline.accounting import Accounting, context_problem
from activities.offline.blocks import PromptView
from activities.offline.cache import CacheUsage, PromptCache
from activities.offline.model import respond
from activities.offline.models import limits_for
from schemas.config import ModelSettings

__all__ = ["OfflineBackend"]


class OfflineBackend:
    """Answers every request by rule, counted, cached and refused as the API would."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.cache = PromptCache(clock)  # `clock`: seconds, for the entries' TTLs

    async def aclose(self) -> None:
        """Nothing is held open."""

    async def create(self, settings: ModelSettings, request: dict[str, Any]) -> Message:
        view = PromptView(request, Accounting(skew=settings.offline_token_skew))
        prompt = view.tokens()
        problem = context_problem(prompt, int(request.get("max_tokens") or 0),
                                  settings.context_window)
        if problem is not None:
            raise api_refusal(400, problem)
        reply = respond(request)
        reply["content"], cut = view.accounting.clip(reply["content"],
                                                     int(request.get("max_tokens") or 0))
        if cut:  # the API stops at max_tokens, whatever the rules had to say
            reply["stop_reason"] = "max_tokens"
        blocks = view.blocks()
        counted = self.cache.account(
            request, blocks, limits_for(str(request.get("model", ""))).min_cacheable_tokens,
            extra_tokens=prompt - sum(b.tokens for b in blocks))
        reply["usage"] = CacheUsage(
            counted.cache_read, counted.cache_creation, counted.input,
            view.accounting.output(reply["content"]), counted.creation_5m,
            counted.creation_1h).as_usage()
        return Message.model_validate(reply)

    async def stream(self, settings: ModelSettings, request: dict[str, Any],
                     on_text: Callable[[str], None]) -> Message:
        message = await self.create(settings, request)
        for block in message.content:
            if block.type == "text" and block.text:
                safe_on_text(on_text, block.text)
        return message
