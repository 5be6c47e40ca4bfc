"""A request as the cache sees it: the prompt's blocks in prefix order, each with its tokens.

The prefix order is tools, then system, then messages (as the API renders a prompt). Each
block is counted with Keel's own tokenizer (`schemas.tokens.count_tokens`), block by block,
so a prefix always measures the same whatever follows it. Each block carries the hash of
the whole prefix up to and including it: two requests share a cached prefix exactly when
those hashes agree. `cache_control` itself is not part of the content.

Speed, without changing a figure: a count depends only on the exact text counted, so
`_count` keeps the latest counts in a bounded LRU keyed on that text (a session resends
the same blocks on every turn); a plain text block's content key likewise depends only on
its text. `PromptView` walks a body once and serves both its blocks and its total, so one
request is not walked once per question asked of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

MESSAGE_OVERHEAD = 4  # tokens per message (role and separators), on its first block
IMAGE_TOKENS = 1_000  # a fixed figure for an image or document block
COUNT_CACHE_SIZE = 16_384  # distinct texts whose counts are kept (a session has ~300)


@dataclass(frozen=True)
class Block:
    where: str  # "tools.0", "system.1", "messages.2.content.0": the API's own paths
    kind: str  # "tool", or the block's type
    tokens: int
    cache_control: dict[str, Any] | None
    prefix_hash: str


def _count(text: str) -> int:
    if not text:
        return 0
    if type(text) is not str:  # whatever the tokenizer makes of it, uncached
        from schemas.tokens import count_tokens

        return count_tokens(text)
    return _count_cached(text)


@lru_cache(maxsize=COUNT_CACHE_SIZE)
def _count_cached(text: str) -> int:
    # Keyed on the exact string: a hit is the count of that very text, never another's.
    from schemas.tokens import count_tokens

    return count_tokens(text)


def _tool_result_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content
                       if isinstance(b, dict) and b.get("type") == "text")
    return str(content or "")


def block_tokens(block: dict[str, Any]) -> int:
    kind = block.get("type")
    if kind == "text":
        return _count(block.get("text", ""))
    if kind == "tool_use":
        return _count(json.dumps(block.get("input", {})))
    if kind == "tool_result":
        extra = 0
        if isinstance(block.get("content"), list):
            extra = sum(IMAGE_TOKENS for b in block["content"]
                        if isinstance(b, dict) and b.get("type") in ("image", "document"))
        return _count(_tool_result_text(block.get("content"))) + extra
    if kind in ("image", "document"):
        return IMAGE_TOKENS
    if kind == "thinking":
        return _count(block.get("thinking", ""))
    return _count(json.dumps(block, sort_keys=True))


def tool_tokens(tool: dict[str, Any]) -> int:
    shown = {k: tool[k] for k in ("name", "description", "input_schema") if k in tool}
    return _count(json.dumps(shown, sort_keys=True))


def _content_key(item: dict[str, Any]) -> bytes:
    """The block's content (all but cache_control) as sorted JSON, encoded for hashing."""
    text = item.get("text")
    if (item.get("type") == "text" and type(text) is str
            and all(k in ("type", "text", "cache_control") for k in item)):
        # Exactly {"type": "text", "text": text} once cache_control is dropped: the same
        # bytes the general case gives, looked up by the text alone.
        return _text_key(text)
    return json.dumps({k: v for k, v in item.items() if k != "cache_control"},
                      sort_keys=True, default=str).encode()


@lru_cache(maxsize=COUNT_CACHE_SIZE)
def _text_key(text: str) -> bytes:
    return json.dumps({"text": text, "type": "text"}, sort_keys=True, default=str).encode()


def system_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    system = body.get("system")
    if isinstance(system, str):
        return [{"type": "text", "text": system}] if system else []
    return [b for b in system or [] if isinstance(b, dict)]


def message_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def prompt_blocks(body: dict[str, Any], *, count_tools: bool = True) -> list[Block]:
    """Every block of the prompt in prefix order, with its tokens and prefix hash.
    `count_tools=False`: tool definitions weigh nothing (they still key the cache)."""
    digest = hashlib.sha256(json.dumps(str(body.get("model", ""))).encode())
    blocks: list[Block] = []

    def add(where: str, head: str, item: dict[str, Any], tokens: int, kind: str) -> None:
        # Fed in parts, the digest is that of head + content key + NUL in one piece.
        digest.update(head.encode())
        digest.update(_content_key(item))
        digest.update(b"\x00")
        control = item.get("cache_control")
        blocks.append(Block(where, kind, tokens, control if isinstance(control, dict) else None,
                            digest.copy().hexdigest()))

    for i, tool in enumerate(body.get("tools") or []):
        if isinstance(tool, dict):
            add(f"tools.{i}", "tool:", tool, tool_tokens(tool) if count_tools else 0, "tool")
    for i, item in enumerate(system_blocks(body)):
        add(f"system.{i}", "system:", item, block_tokens(item), str(item.get("type")))
    for m, message in enumerate(body.get("messages") or []):
        if not isinstance(message, dict):
            continue
        items = message_blocks(message)
        if not items:  # an empty message still costs its overhead
            digest.update(f"msg:{message.get('role')}:empty".encode())
            continue
        for j, item in enumerate(items):
            head = f"msg:{message.get('role')}:" if j == 0 else "+"
            tokens = block_tokens(item) + (MESSAGE_OVERHEAD if j == 0 else 0)
            add(f"messages.{m}.content.{j}", head, item, tokens, str(item.get("type")))
    return blocks


def _empty_messages(body: dict[str, Any]) -> int:
    return sum(1 for m in body.get("messages") or []
               if isinstance(m, dict) and not message_blocks(m))


def request_tokens(body: dict[str, Any], *, count_tools: bool = True) -> int:
    """What the fake API counts for this request's whole prompt: tool definitions, system
    blocks and every message block, with Keel's tokenizer, plus a small per-message
    overhead."""
    blocks = prompt_blocks(body, count_tools=count_tools)
    return sum(b.tokens for b in blocks) + MESSAGE_OVERHEAD * _empty_messages(body)


class PromptView:
    """One body's blocks and total, worked out once, on first use (a malformed body is
    only walked if a check gets that far). The body must not change while a view is
    used: the server makes one per step of handling a request."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self._blocks: dict[bool, list[Block]] = {}
        self._tokens: dict[bool, int] = {}

    def blocks(self, *, count_tools: bool = True) -> list[Block]:
        if count_tools not in self._blocks:
            if count_tools or True not in self._blocks:
                self._blocks[count_tools] = prompt_blocks(self.body, count_tools=count_tools)
            else:  # the same walk, with tool definitions weighing nothing
                self._blocks[False] = [
                    dataclasses.replace(b, tokens=0) if b.where.startswith("tools.") else b
                    for b in self._blocks[True]]
        return self._blocks[count_tools]

    def tokens(self, *, count_tools: bool = True) -> int:
        if count_tools not in self._tokens:
            self._tokens[count_tools] = (sum(b.tokens for b in self.blocks(
                count_tools=count_tools)) + MESSAGE_OVERHEAD * _empty_messages(self.body))
        return self._tokens[count_tools]
