"""How long a session's prompt-cache entries should live: five minutes or an hour.

Invariant: each model call marks its breakpoints with one lifetime, chosen from how long
the session's recent calls waited for one another (between turns, for a person's approval
or a budget raise, for a sub-agent, for a long tool). `auto` (the default) asks for an hour
when those waits say an hour would have cost less than five minutes; a session that has
not waited past five minutes (and within the hour) keeps the API's default, byte for byte
the requests it always sent. `5m` and `1h` fix the lifetime.

Why: Anthropic bills a cache write at 1.25x the input price for five minutes and 2x for an
hour, a read at 0.1x, and keys an entry on the whole prefix up to its breakpoint. A call
asked more than five minutes after the one before (a person reading, a Watch every quarter
hour, an approval answered later) finds the five-minute entries gone and writes its whole
context again, 1.25x of all of it, where an hour's entry is read for 0.1x: 1.15x of the
context saved. The hour costs 0.75x more on what each call writes. So the hour is asked for
when the share of recent waits it bridges, times 1.15x the context, passes 0.75x of what a
call usually writes: the lower median of the calls asked within five minutes of the one
before (a session's first call, and one after a longer wait, write the whole context; they
would make the hour look dear by the very rewrites it saves). With no usual call measured
yet, the hour once a quarter of the waits are such waits. A wait over an hour outlives
both, and counts against the hour. Every breakpoint of a call gets the same lifetime, so no
hour follows five minutes (the API refuses that order); a call that switches to the hour
writes its new part for an hour, and that entry holds the whole prefix before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from schemas.model import http_error_type

__all__ = ["LONG_S", "RECENT_GAPS", "SHORT_S", "CacheTtl", "cache_ttl", "lifetime_refused",
           "remember_gap", "remember_written", "short_lived"]

SHORT_S = 300.0  # the API's default lifetime, refreshed by every read
LONG_S = 3600.0
RECENT_GAPS = 32  # the waits between calls a session remembers (SessionState.call_gaps_s)
LONG_SHARE = 0.25  # of them bridged by an hour and not by five minutes: the hour, unmeasured
# The API's prices of a cache write (five minutes, an hour) and a read, over the input's.
SHORT_WRITE, LONG_WRITE, READ = 1.25, 2.0, 0.1


class CacheTtl(StrEnum):
    AUTO = "auto"
    SHORT = "5m"
    LONG = "1h"


def cache_ttl(mode: CacheTtl, gaps_s: Sequence[float], context_tokens: int = 0,
              written: Sequence[int] = ()) -> CacheTtl:
    """The lifetime of a call's cache entries: `mode`, or for `auto` the one the session's
    recent waits between calls (seconds, oldest first), its context and what its recent
    calls wrote (input tokens billed: uncached and cache writes) call for."""
    if mode is not CacheTtl.AUTO:
        return mode
    recent = list(gaps_s)[-RECENT_GAPS:]
    bridged = sum(1 for gap in recent if SHORT_S < gap <= LONG_S)
    if not bridged:
        return CacheTtl.SHORT
    share = bridged / len(recent)
    usual = sorted(written[-RECENT_GAPS:])
    if context_tokens > 0 and usual:
        per_call = usual[(len(usual) - 1) // 2]  # the lower median: rewrites run high
        saves = share * (SHORT_WRITE - READ) * context_tokens
        return CacheTtl.LONG if saves >= (LONG_WRITE - SHORT_WRITE) * per_call \
            else CacheTtl.SHORT
    return CacheTtl.LONG if share >= LONG_SHARE else CacheTtl.SHORT


def remember_gap(gaps_s: list[float], gap_s: float) -> list[float]:
    """`gaps_s` with `gap_s` added, the oldest beyond RECENT_GAPS let go."""
    return [*gaps_s, round(max(gap_s, 0.0), 3)][-RECENT_GAPS:]


def remember_written(written: list[int], tokens: int, waited_s: float | None) -> list[int]:
    """What the recent calls wrote, with this call's `tokens`, the oldest let go: a usual
    call's only. A session's first call (`waited_s` None) writes its whole context, and so
    does one after a wait its entries did not outlive: counted, they would make the hour
    look dear by the very rewrites it saves."""
    if waited_s is None or waited_s > SHORT_S:
        return written
    return [*written, max(tokens, 0)][-RECENT_GAPS:]


def lifetime_refused(error_type: str | None, message: str, ttl: str) -> bool:
    """Whether the API refused a request for its cache lifetime: a 400 about `ttl` to a
    request that asked for more than the default (a provider or proxy that does not take
    the hour, or the order rule)."""
    return ttl != CacheTtl.SHORT and error_type == http_error_type(400) and "ttl" in message


def short_lived(request: dict[str, Any]) -> dict[str, Any]:
    """`request` with every cache breakpoint at the API's default lifetime (a copy where a
    breakpoint changes; the blocks without one are shared)."""
    def plain(block: Any) -> Any:
        control = block.get("cache_control") if isinstance(block, dict) else None
        if not isinstance(control, dict) or "ttl" not in control:
            return block
        return {**block, "cache_control": {k: v for k, v in control.items() if k != "ttl"}}

    out = dict(request)
    for key in ("system", "tools"):
        if isinstance(request.get(key), list):
            out[key] = [plain(b) for b in request[key]]
    out["messages"] = [
        {**m, "content": [plain(b) for b in m["content"]]} if isinstance(m.get("content"), list)
        else m for m in request.get("messages", [])]
    return out
