"""Prompt caching as the Anthropic docs describe it: the offline model's (a cache per worker
process, activities.offline.backend) and the test fake's (one per server) one copy of the
rule.

- A breakpoint is a block with `cache_control: {"type": "ephemeral"}` (optional `"ttl"`:
  "5m", the default, or "1h"); a top-level `cache_control` on the request puts one on the
  last cacheable block (automatic caching). At most 4 per request (checked in rules).
- Read: for each breakpoint the API checks the block boundaries from the breakpoint back
  through up to 20 blocks for a prefix an earlier request wrote; the longest hit is read,
  and reading refreshes that entry's TTL.
- Write: every breakpoint past the read point whose prefix reaches the model's minimum
  cacheable length gets an entry; the tokens from the read point to the last such
  breakpoint are the cache write. A prefix under the minimum is simply not cached.
- Usage: `cache_read_input_tokens` up to the read point, `cache_creation_input_tokens`
  from there to the last write, `input_tokens` the rest; the three sum to the prompt.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from activities.offline.blocks import Block

LOOKBACK_BLOCKS = 20
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
CACHEABLE_TYPES = {"text", "image", "document", "tool_use", "tool_result"}


@dataclass
class CacheEntry:
    tokens: int
    ttl: str
    expires_at: float


@dataclass(frozen=True)
class CacheUsage:
    cache_read: int
    cache_creation: int
    input: int
    output: int = 0
    creation_5m: int = 0
    creation_1h: int = 0

    @property
    def total_input(self) -> int:
        return self.cache_read + self.cache_creation + self.input

    def as_usage(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input,
            "cache_creation_input_tokens": self.cache_creation,
            "cache_read_input_tokens": self.cache_read,
            "cache_creation": {"ephemeral_5m_input_tokens": self.creation_5m,
                               "ephemeral_1h_input_tokens": self.creation_1h},
            "output_tokens": self.output,
            "service_tier": "standard",
        }


def breakpoints(body: dict[str, Any], blocks: list[Block]) -> list[tuple[int, str]]:
    """(block index, ttl) of every breakpoint, in prefix order."""
    found = [(i, str(b.cache_control.get("ttl") or "5m"))
             for i, b in enumerate(blocks) if b.cache_control is not None]
    auto = body.get("cache_control")
    if isinstance(auto, dict) and blocks:
        last = _last_cacheable(blocks)
        if last is not None and all(i != last for i, _ in found):
            found.append((last, str(auto.get("ttl") or "5m")))
            found.sort()
    return found


def _last_cacheable(blocks: list[Block]) -> int | None:
    for i in range(len(blocks) - 1, -1, -1):
        if blocks[i].kind == "tool" or blocks[i].kind in CACHEABLE_TYPES:
            return i
    return None


class PromptCache:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._entries: dict[str, CacheEntry] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        now = self.clock()
        with self._lock:
            return sum(1 for e in self._entries.values() if e.expires_at > now)

    def account(self, body: dict[str, Any], blocks: list[Block], min_tokens: int,
                extra_tokens: int = 0) -> CacheUsage:
        """Read and write the cache for one request; what its usage reports."""
        prefix: list[int] = []
        running = 0
        for b in blocks:
            running += b.tokens
            prefix.append(running)
        total = running + extra_tokens
        points = breakpoints(body, blocks)
        now = self.clock()
        with self._lock:
            for key in [k for k, e in self._entries.items() if e.expires_at <= now]:
                del self._entries[key]
            read_at = -1
            for index, _ttl in points:
                for j in range(index, max(-1, index - LOOKBACK_BLOCKS), -1):
                    if blocks[j].prefix_hash in self._entries:
                        read_at = max(read_at, j)
                        break
            if read_at >= 0:
                entry = self._entries[blocks[read_at].prefix_hash]
                entry.expires_at = now + TTL_SECONDS.get(entry.ttl, 300.0)
            read = prefix[read_at] if read_at >= 0 else 0
            written_to, by_ttl = read_at, {"5m": 0, "1h": 0}
            for index, ttl in points:
                if index <= read_at or prefix[index] < min_tokens:
                    continue
                key = blocks[index].prefix_hash
                existing = self._entries.get(key)
                keep = "1h" if ttl == "1h" or (existing and existing.ttl == "1h") else "5m"
                self._entries[key] = CacheEntry(prefix[index], keep,
                                                now + TTL_SECONDS.get(keep, 300.0))
                by_ttl[ttl if ttl in by_ttl else "5m"] += prefix[index] - (
                    prefix[written_to] if written_to >= 0 else 0)
                written_to = index
        creation = (prefix[written_to] - read) if written_to > read_at else 0
        return CacheUsage(cache_read=read, cache_creation=creation,
                          input=total - read - creation,
                          creation_5m=by_ttl["5m"], creation_1h=by_ttl["1h"])
