"""How the Messages API counts a request, and how it refuses one: the offline model's and
the test fake's one copy of the rule.

Invariant: a request's count is every block the API counts: each tool definition, the
hidden tool-use system prompt the API adds whenever tools are offered, each system block,
each message block (text, tool calls, tool results, images, documents) and a small overhead per
message; the total is `skew` times the tokenizer's count, block by block, so the two
instruments that use this (the offline model, `tests/fake_anthropic`) disagree with Keel's
own estimate (`schemas.context.estimate_tokens`) the way a real model's tokenizer does:
by a factor (0.8 and 1.25 are the benchmark's) and a fixed part. A prompt past the window,
or a prompt whose reply room would pass it, is refused with the API's own words.

An image counts as the API's vision guide says for its pixels (`vision_tokens`), a PDF
`PDF_PAGE_TOKENS_COUNTED` a page, a text document its text, both with their title; a file
whose size cannot be read keeps the fixed `IMAGE_TOKENS`. Sizes and pages are read by Keel's
own header parsers (`schemas.attachments`): this runs in the worker, where Pillow and pypdf
are not installed.

This is not Keel's estimator: Keel never calls it to size a request. It stands in for the
API, whose count Keel reads back from usage and from refusals.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from schemas.attachments import image_size, pdf_pages
from schemas.tokens import count_tokens, truncate_to_tokens

__all__ = [
    "IMAGE_TOKENS", "MESSAGE_OVERHEAD", "PDF_PAGE_TOKENS_COUNTED", "TOOL_PROMPT_TOKENS",
    "Accounting", "context_problem", "message_blocks", "system_blocks", "too_long_message",
    "vision_tokens",
]

MESSAGE_OVERHEAD = 4  # tokens per message (role and separators), on its first block
IMAGE_TOKENS = 1_000  # a fixed figure for an image or document whose size cannot be read
# A PDF page is its text and an image of it: 1,500 to 3,000 tokens by the API's guide. Keel's
# estimate takes 3,000 (schemas.attachments.PDF_PAGE_TOKENS); counting less here keeps the
# estimate above the count, as it must be.
PDF_PAGE_TOKENS_COUNTED = 2_000
# The vision guide: an image is scaled down (its aspect kept) until its long edge is at most
# 1,568 pixels and its area at most 1,092² pixels, then costs a token per 750 pixels.
VISION_LONG_EDGE = 1_568
VISION_MAX_PIXELS = 1_192_464
VISION_PIXELS_PER_TOKEN = 750
PDF = "application/pdf"
_MEDIA_CACHE = 64  # distinct files whose counts are kept (the keys hold their base64)
# The system prompt the API adds when a request offers tools ("tool use system prompt" in
# Anthropic's tool-use pricing table: 346 tokens for tool_choice auto or none on current
# models, 313 for any or a named tool).
TOOL_PROMPT_TOKENS = 346
TOOL_PROMPT_TOKENS_FORCED = 313
_COUNT_CACHE = 16_384  # distinct texts whose counts are kept (a session resends its blocks)


@lru_cache(maxsize=_COUNT_CACHE)
def _count_cached(text: str) -> int:
    return count_tokens(text)


def _count(text: Any) -> int:
    if not text:
        return 0
    if type(text) is not str:
        return count_tokens(str(text))
    return _count_cached(text)


def _tool_result_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content
                       if isinstance(b, dict) and b.get("type") == "text")
    return str(content or "")


def vision_tokens(width: int, height: int) -> int:
    """What the API counts for an image of this size: scaled down to whole pixels within
    VISION_LONG_EDGE and VISION_MAX_PIXELS, then a token per 750 pixels. The sides are
    rounded down (the guide does not say how a resize rounds): that keeps the count at or
    below Keel's estimate (`schemas.attachments.image_tokens`, unrounded)."""
    scale = min(1.0, VISION_LONG_EDGE / max(width, height),
                math.sqrt(VISION_MAX_PIXELS / (width * height)))
    # The epsilon: a side that scales to a whole number exactly is not lost to float error.
    w = max(1, math.floor(width * scale + 1e-9))
    h = max(1, math.floor(height * scale + 1e-9))
    return math.ceil(w * h / VISION_PIXELS_PER_TOKEN)


def _decoded(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


@lru_cache(maxsize=_MEDIA_CACHE)
def _image_tokens(media_type: str, data: str) -> int:
    raw = _decoded(data)
    size = image_size(raw, media_type) if raw else None
    return vision_tokens(*size) if size else IMAGE_TOKENS


@lru_cache(maxsize=_MEDIA_CACHE)
def _pdf_tokens(data: str) -> int:
    raw = _decoded(data)
    pages = pdf_pages(raw) if raw else None
    return pages * PDF_PAGE_TOKENS_COUNTED if pages else IMAGE_TOKENS


def _media_block(block: dict[str, Any]) -> int:
    """An image or document block: by its pixels, pages or text (with a document's title);
    IMAGE_TOKENS for one whose source this does not read (a URL, a file id, a malformed one)."""
    source = block.get("source")
    if not isinstance(source, dict):
        return IMAGE_TOKENS
    kind, media_type, data = source.get("type"), source.get("media_type"), source.get("data")
    if block.get("type") == "image":
        if kind == "base64" and type(media_type) is str and type(data) is str:
            return _image_tokens(media_type, data)
        return IMAGE_TOKENS
    if kind == "base64" and media_type == PDF and type(data) is str:
        return _pdf_tokens(data) + _count(block.get("title"))
    if kind == "text" and type(data) is str:
        return _count(data) + _count(block.get("title"))
    return IMAGE_TOKENS


def _raw_block(block: dict[str, Any]) -> int:
    kind = block.get("type")
    if kind == "text":
        return _count(block.get("text", ""))
    if kind == "tool_use":
        return _count(str(block.get("name", ""))) + _count(json.dumps(block.get("input", {})))
    if kind == "tool_result":
        extra = 0
        if isinstance(block.get("content"), list):
            extra = sum(_media_block(b) for b in block["content"]
                        if isinstance(b, dict) and b.get("type") in ("image", "document"))
        return _count(_tool_result_text(block.get("content"))) + extra
    if kind in ("image", "document"):
        return _media_block(block)
    if kind == "thinking":
        return _count(block.get("thinking", ""))
    return _count(json.dumps(block, sort_keys=True))


def _raw_tool(tool: dict[str, Any]) -> int:
    shown = {k: tool[k] for k in ("name", "description", "input_schema") if k in tool}
    return _count(json.dumps(shown, sort_keys=True))


def system_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A body's system prompt as blocks (a string is one text block)."""
    system = body.get("system")
    if isinstance(system, str):
        return [{"type": "text", "text": system}] if system else []
    return [b for b in system or [] if isinstance(b, dict)]


def message_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A message's content as blocks (a string is one text block)."""
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


@dataclass(frozen=True)
class Accounting:
    """The API's count at a tokenizer skew (1.0: Keel's tokenizer exactly)."""

    skew: float = 1.0
    count_tools: bool = True  # False: tool definitions weigh nothing (an old fake's way)

    def scaled(self, tokens: int) -> int:
        return tokens if self.skew == 1.0 else round(tokens * self.skew)

    def block(self, block: dict[str, Any]) -> int:
        return self.scaled(_raw_block(block))

    def tool(self, tool: dict[str, Any]) -> int:
        return self.scaled(_raw_tool(tool)) if self.count_tools else 0

    def tool_prompt(self, body: dict[str, Any]) -> int:
        """The hidden tool-use system prompt: counted whenever tools are offered."""
        if not self.count_tools or not [t for t in body.get("tools") or []
                                        if isinstance(t, dict)]:
            return 0
        choice = body.get("tool_choice") or {}
        forced = isinstance(choice, dict) and choice.get("type") in ("any", "tool")
        return TOOL_PROMPT_TOKENS_FORCED if forced else TOOL_PROMPT_TOKENS

    def request(self, body: dict[str, Any]) -> int:
        """The whole prompt of `body` as the API counts it."""
        total = self.tool_prompt(body)
        total += sum(self.tool(t) for t in body.get("tools") or [] if isinstance(t, dict))
        total += sum(self.block(b) for b in system_blocks(body))
        for message in body.get("messages") or []:
            if isinstance(message, dict):
                total += MESSAGE_OVERHEAD + sum(self.block(b)
                                                for b in message_blocks(message))
        return total

    def output(self, content: list[dict[str, Any]]) -> int:
        """A reply's output tokens: its blocks as the API counts them (at least one)."""
        return max(1, sum(self.block(b) for b in content))

    def clip(self, content: list[dict[str, Any]],
             max_tokens: int) -> tuple[list[dict[str, Any]], bool]:
        """The reply as the API ends it at `max_tokens`: whole blocks while they fit, a
        text block cut at the limit (a tool call past it is not sent); and whether it was
        cut (stop_reason "max_tokens")."""
        kept: list[dict[str, Any]] = []
        used = 0
        for block in content:
            size = self.block(block)
            if used + size <= max_tokens:
                kept.append(block)
                used += size
                continue
            left = int((max_tokens - used) / max(self.skew, 0.01))
            if block.get("type") == "text" and left > 0:
                kept.append({**block, "text": truncate_to_tokens(block["text"], left)})
            return kept, True
        return kept, False


def too_long_message(prompt_tokens: int, window: int) -> str:
    return f"prompt is too long: {prompt_tokens} tokens > {window} maximum"


def context_problem(prompt_tokens: int, max_tokens: int, window: int) -> str | None:
    """The API's refusal of a prompt of this size, or None when it may be sent."""
    if prompt_tokens > window:
        return too_long_message(prompt_tokens, window)
    if prompt_tokens + max_tokens > window:
        return (f"input length and `max_tokens` exceed context limit: {prompt_tokens} +"
                f" {max_tokens} > {window}, decrease input length or `max_tokens` and try"
                " again")
    return None
