"""A request as the cache sees it: the prompt's blocks in prefix order, each with its tokens.

The prefix order is tools, then system, then messages (as the API renders a prompt). Each
block is counted by the API's rule (`activities.offline.accounting.Accounting`: every
block, the tool definitions and the hidden tool-use prompt, at the caller's tokenizer skew),
block by block, so a prefix always measures the same whatever follows it; the tool-use
prompt weighs on the first tool's block, where the API puts it, ahead of everything. Each
block carries the hash of the whole prefix up to and including it: two requests share a
cached prefix exactly when those hashes agree. `cache_control` itself is not part of the
content.

Speed, without changing a figure: counts are kept per exact text (the accounting's LRU); a
plain text block's content key likewise depends only on its text. `PromptView` walks a body
once and serves both its blocks and its total, so one request is not walked once per
question asked of it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from activities.offline.accounting import (
    MESSAGE_OVERHEAD,
    Accounting,
    message_blocks,
    system_blocks,
)

EXACT = Accounting()

COUNT_CACHE_SIZE = 16_384  # distinct texts whose content keys are kept


@dataclass(frozen=True)
class Block:
    where: str  # "tools.0", "system.1", "messages.2.content.0": the API's own paths
    kind: str  # "tool", or the block's type
    tokens: int
    cache_control: dict[str, Any] | None
    prefix_hash: str


def block_tokens(block: dict[str, Any], accounting: Accounting = EXACT) -> int:
    return accounting.block(block)


def tool_tokens(tool: dict[str, Any], accounting: Accounting = EXACT) -> int:
    return accounting.tool(tool)


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


def prompt_blocks(body: dict[str, Any], accounting: Accounting = EXACT) -> list[Block]:
    """Every block of the prompt in prefix order, with its tokens and prefix hash, as
    `accounting` counts them (tool definitions that weigh nothing still key the cache)."""
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

    hidden = accounting.tool_prompt(body)  # the tool-use prompt: on the first tool's block
    for i, tool in enumerate(body.get("tools") or []):
        if isinstance(tool, dict):
            add(f"tools.{i}", "tool:", tool, accounting.tool(tool) + hidden, "tool")
            hidden = 0
    for i, item in enumerate(system_blocks(body)):
        add(f"system.{i}", "system:", item, accounting.block(item), str(item.get("type")))
    for m, message in enumerate(body.get("messages") or []):
        if not isinstance(message, dict):
            continue
        items = message_blocks(message)
        if not items:  # an empty message still costs its overhead
            digest.update(f"msg:{message.get('role')}:empty".encode())
            continue
        for j, item in enumerate(items):
            head = f"msg:{message.get('role')}:" if j == 0 else "+"
            tokens = accounting.block(item) + (MESSAGE_OVERHEAD if j == 0 else 0)
            add(f"messages.{m}.content.{j}", head, item, tokens, str(item.get("type")))
    return blocks


def _empty_messages(body: dict[str, Any]) -> int:
    return sum(1 for m in body.get("messages") or []
               if isinstance(m, dict) and not message_blocks(m))


def request_tokens(body: dict[str, Any], accounting: Accounting = EXACT) -> int:
    """What the fake API counts for this request's whole prompt (the same total as
    `accounting.request(body)`, summed from the blocks the cache sees)."""
    blocks = prompt_blocks(body, accounting)
    return sum(b.tokens for b in blocks) + MESSAGE_OVERHEAD * _empty_messages(body)


class PromptView:
    """One body's blocks and total, worked out once, on first use (a malformed body is
    only walked if a check gets that far). The body must not change while a view is
    used: the server makes one per step of handling a request."""

    def __init__(self, body: dict[str, Any], accounting: Accounting = EXACT) -> None:
        self.body = body
        self.accounting = accounting
        self._blocks: list[Block] | None = None
        self._tokens: int | None = None

    def blocks(self) -> list[Block]:
        if self._blocks is None:
            self._blocks = prompt_blocks(self.body, self.accounting)
        return self._blocks

    def tokens(self) -> int:
        if self._tokens is None:
            self._tokens = (sum(b.tokens for b in self.blocks())
                            + MESSAGE_OVERHEAD * _empty_messages(self.body))
        return self._tokens
