"""Scripted replies: a message the model "sends", or an error the API answers with."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

_ids = itertools.count(1)
DEFAULT_MODEL = "fake-model"  # a reply naming it is answered with the requested model


def next_id(prefix: str) -> str:
    return f"{prefix}_fake_{next(_ids)}"


def text_message(text: str, *, model: str = DEFAULT_MODEL, input_tokens: int | None = None,
                 output_tokens: int = 5, stop_reason: str = "end_turn") -> dict[str, Any]:
    """A reply with one text block. Left as None, `input_tokens` (and the cache fields) are
    filled in from the request, as the API would count it."""
    return {
        "id": next_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def tool_use_message(calls: list[tuple[str, dict[str, Any]]], *, text: str = "",
                     model: str = DEFAULT_MODEL, input_tokens: int | None = None,
                     ) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for name, args in calls:
        content.append({"type": "tool_use", "id": next_id("toolu"), "name": name,
                        "input": args})
    return {
        "id": next_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 20},
    }


# The API's error type for each status (docs: "HTTP errors"), and its usual message.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
DEFAULT_MESSAGES = {
    "authentication_error": "invalid x-api-key",
    "permission_error": "Your API key does not have permission to use the specified resource.",
    "not_found_error": "Not found",
    "request_too_large": "Request exceeds the maximum allowed number of bytes.",
    "rate_limit_error": ("This request would exceed the rate limit for your organization of"
                         " 50 requests per minute. For details, refer to:"
                         " https://docs.claude.com/en/api/rate-limits."),
    "api_error": "Internal server error",
    "timeout_error": "Request timed out",
    "overloaded_error": "Overloaded",
}


@dataclass
class ErrorStep:
    """An error the API answers with. `error_type` and `message` default to what the API
    sends for `status`; a 429 carries `retry-after` unless `headers` say otherwise.

    `mid_stream=True`: on a streaming request the response starts (200, message_start)
    and then fails with an `event: error`, as the API can when overloaded; on a
    non-streaming request it is a plain HTTP error.
    """

    status: int
    error_type: str | None = None
    message: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    mid_stream: bool = False

    def __post_init__(self) -> None:
        if self.error_type is None:
            self.error_type = ERROR_TYPES.get(self.status, "api_error" if self.status >= 500
                                              else "invalid_request_error")
        if self.message is None:
            self.message = DEFAULT_MESSAGES.get(self.error_type, "scripted error")
        if self.status == 429:
            self.headers = {"retry-after": "1", **self.headers}

    def body(self, request_id: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.error_type, "message": self.message},
                "request_id": request_id}

    @classmethod
    def overloaded(cls, *, mid_stream: bool = False) -> ErrorStep:
        return cls(529, "overloaded_error", mid_stream=mid_stream)

    @classmethod
    def rate_limited(cls, retry_after: float = 1) -> ErrorStep:
        return cls(429, "rate_limit_error", headers={"retry-after": f"{retry_after:g}"})

    @classmethod
    def server_error(cls) -> ErrorStep:
        return cls(500, "api_error")

    @classmethod
    def unauthorized(cls) -> ErrorStep:
        return cls(401, "authentication_error")

    @classmethod
    def too_large(cls) -> ErrorStep:
        return cls(413, "request_too_large")

    @classmethod
    def invalid(cls, message: str) -> ErrorStep:
        return cls(400, "invalid_request_error", message)
