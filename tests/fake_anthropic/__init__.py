"""A fake Anthropic Messages API on loopback, for tests; the real `anthropic` SDK talks to it.

    server = FakeAnthropic(responder, strict=True, context_window=None,
                           max_output_tokens=None, min_cacheable_tokens=None,
                           count_tool_definitions=True, clock=time.monotonic).start()

- `server.py`: scripting (push / reset / responder), records (`requests`, `usages`,
  `rejections`), HTTP and SSE; `FAKE_ANTHROPIC_REJECTIONS=path` logs every refusal.
- `rules.py`: what the API refuses with a 400 (on while `strict`).
- `media.py`: its image and document blocks: what the API refuses of a file (read with
  Pillow and pypdf, readers Keel's own parsers are tested against).
- `stream.py`: the event stream for `"stream": true`.
- `replies.py`: `text_message`, `tool_use_message`, `ErrorStep`.

Shared with Keel's offline model, so the two count and cache alike (activities.offline):
`accounting.py` (the API's count and its refusals), `blocks.py` (the prompt's blocks in
prefix order, counted), `cache.py` (prompt caching: breakpoints, 20-block lookback, minimum
length, TTLs), `models.py` (per-model context window, output limit, minimum cacheable
length).
"""

from activities.offline.blocks import request_tokens
from activities.offline.cache import CacheUsage
from activities.offline.models import ModelLimits, limits_for
from tests.fake_anthropic.replies import ErrorStep, text_message, tool_use_message
from tests.fake_anthropic.server import FakeAnthropic, ManualClock, Rejection, Responder, Step

__all__ = [
    "CacheUsage",
    "ErrorStep",
    "FakeAnthropic",
    "ManualClock",
    "ModelLimits",
    "Rejection",
    "Responder",
    "Step",
    "limits_for",
    "request_tokens",
    "text_message",
    "tool_use_message",
]
