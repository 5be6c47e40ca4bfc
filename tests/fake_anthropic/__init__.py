"""A fake Anthropic Messages API on loopback, for tests (see `server.py`)."""

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
