"""How long a session's prompt-cache entries should live: five minutes or an hour.

Invariant: a turn's requests mark their breakpoints with one lifetime, chosen when the turn
starts from how the session has been used: `auto` (the default) asks for an hour when the
session's recent gaps between turns say an hour would have cost less than five minutes; a
session that has shown no gap an hour bridges and five minutes do not keeps the API's
default, byte for byte the requests it always sent. `5m` and `1h` fix the lifetime.

Why: Anthropic bills a cache write at 1.25x the input price for five minutes and 2x for an
hour, a read at 0.1x. A session whose next input comes more than five minutes after a turn
(a person reading, a Watch every quarter hour, a wakeup the agent scheduled for later)
finds its five-minute entries gone and writes its whole context again: 1.25x of all of it,
where an hour's entry is read for 0.1x, 1.15x of the context saved. The hour costs 0.75x
more on what each turn writes. So the hour is asked for when the share of recent gaps it
bridges, times 1.15x the context, passes 0.75x of what a turn writes (the median of the
recent turns': a turn that wrote the whole context again after a gap does not count as a
usual one); with nothing measured yet, when a quarter of the gaps are such gaps. A gap over
an hour outlives both, and counts against the hour. Every breakpoint of the turn gets the
same lifetime, so no hour follows five minutes (the API refuses that order).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

__all__ = ["LONG_S", "RECENT_GAPS", "SHORT_S", "CacheTtl", "remember_gap", "remember_written",
           "turn_cache_ttl"]

SHORT_S = 300.0  # the API's default lifetime, refreshed by every read
LONG_S = 3600.0
RECENT_GAPS = 8  # the gaps between turns a session remembers (SessionState.turn_gaps_s)
LONG_SHARE = 0.25  # of them bridged by an hour and not by five minutes: the hour, unmeasured
# The API's prices of a cache write (five minutes, an hour) and a read, over the input's.
SHORT_WRITE, LONG_WRITE, READ = 1.25, 2.0, 0.1


class CacheTtl(StrEnum):
    AUTO = "auto"
    SHORT = "5m"
    LONG = "1h"


def turn_cache_ttl(mode: CacheTtl, gaps_s: Sequence[float], context_tokens: int = 0,
                   written: Sequence[int] = ()) -> CacheTtl:
    """The lifetime of a turn's cache entries: `mode`, or for `auto` the one the session's
    recent gaps between turns (seconds, oldest first), its context and what its recent
    turns wrote (input tokens billed: uncached and cache writes) call for."""
    if mode is not CacheTtl.AUTO:
        return mode
    recent = list(gaps_s)[-RECENT_GAPS:]
    bridged = sum(1 for gap in recent if SHORT_S < gap <= LONG_S)
    if not bridged:
        return CacheTtl.SHORT
    share = bridged / len(recent)
    usual = sorted(written[-RECENT_GAPS:])
    if context_tokens > 0 and usual:
        per_turn = usual[len(usual) // 2]
        saves = share * (SHORT_WRITE - READ) * context_tokens
        return CacheTtl.LONG if saves >= (LONG_WRITE - SHORT_WRITE) * per_turn \
            else CacheTtl.SHORT
    return CacheTtl.LONG if share >= LONG_SHARE else CacheTtl.SHORT


def remember_gap(gaps_s: list[float], gap_s: float) -> list[float]:
    """`gaps_s` with `gap_s` added, the oldest beyond RECENT_GAPS let go."""
    return [*gaps_s, round(max(gap_s, 0.0), 3)][-RECENT_GAPS:]


def remember_written(written: list[int], tokens: int) -> list[int]:
    """What the recent turns wrote, with this turn's `tokens`, the oldest let go."""
    return [*written, max(tokens, 0)][-RECENT_GAPS:]
