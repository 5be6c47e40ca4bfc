"""A fake Anthropic Messages API on loopback, for tests; the real `anthropic` SDK talks to it.

    server = FakeAnthropic(responder, strict=True, context_window=None,
                           max_output_tokens=None, min_cacheable_tokens=None,
                           count_tool_definitions=True, clock=time.monotonic).start()

- `server.py`: scripting (push / reset / responder), records (`requests`, `usages`,
  `rejections`), HTTP and SSE; `FAKE_ANTHROPIC_REJECTIONS=path` logs every refusal.
- `rules.py`: what the API refuses with a 400 (on while `strict`).
- `media.py`: its image and document blocks: what the API refuses of a file (read with
  Pillow and pypdf, readers Keel's own parsers are tested against).
- `cache.py`: prompt caching (breakpoints, 20-block lookback, minimum length, TTLs).
- `prompt.py`: the prompt's blocks in prefix order, counted with Keel's tokenizer.
- `stream.py`: the event stream for `"stream": true`.
- `models.py`: per-model context window, output limit, minimum cacheable length.
- `replies.py`: `text_message`, `tool_use_message`, `ErrorStep`.
"""

from tests.fake_anthropic.cache import CacheUsage
from tests.fake_anthropic.models import ModelLimits, limits_for
from tests.fake_anthropic.prompt import request_tokens
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
