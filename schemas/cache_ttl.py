"""How long a session's prompt-cache entries should live: five minutes or an hour.

Invariant: a turn's requests mark their breakpoints with one lifetime, chosen when the turn
starts from how the session has been used: `auto` (the default) asks for an hour once a
quarter or more of the session's recent gaps between turns were ones an hour's entry
outlives and a five minutes' does not; a session that has shown no such gap keeps the API's
default, byte for byte the requests it always sent. `5m` and `1h` fix the lifetime.

Why: Anthropic bills a cache write at 1.25x the input price for five minutes and 2x for an
hour, a read at 0.1x. A session whose next input comes more than five minutes after a turn
(a person reading, a Watch every quarter hour, a wakeup the agent scheduled for later)
finds its five-minute entries gone and writes its whole context again: 1.25x of all of it,
where an hour's entry is read for 0.1x. The hour costs 0.75x more only on what a turn
writes new, a small part of a long context: for a context ten times a turn's new tokens,
the hour pays for itself if one gap in fifteen is such a gap; a quarter leaves room for the
context to be smaller. A gap over an hour outlives both, and counts against the hour.
Every breakpoint of the turn gets the same lifetime, so no hour follows five minutes (the
API refuses that order).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

__all__ = ["LONG_S", "RECENT_GAPS", "SHORT_S", "CacheTtl", "remember_gap", "turn_cache_ttl"]

SHORT_S = 300.0  # the API's default lifetime, refreshed by every read
LONG_S = 3600.0
RECENT_GAPS = 8  # the gaps between turns a session remembers (SessionState.turn_gaps_s)
LONG_SHARE = 0.25  # of them, bridged by an hour and not by five minutes: ask for the hour


class CacheTtl(StrEnum):
    AUTO = "auto"
    SHORT = "5m"
    LONG = "1h"


def turn_cache_ttl(mode: CacheTtl, gaps_s: Sequence[float]) -> CacheTtl:
    """The lifetime of a turn's cache entries: `mode`, or for `auto` the one the session's
    recent gaps between turns (seconds, oldest first) call for."""
    if mode is not CacheTtl.AUTO:
        return mode
    recent = list(gaps_s)[-RECENT_GAPS:]
    bridged = sum(1 for gap in recent if SHORT_S < gap <= LONG_S)
    return CacheTtl.LONG if recent and bridged >= LONG_SHARE * len(recent) else CacheTtl.SHORT


def remember_gap(gaps_s: list[float], gap_s: float) -> list[float]:
    """`gaps_s` with `gap_s` added, the oldest beyond RECENT_GAPS let go."""
    return [*gaps_s, round(max(gap_s, 0.0), 3)][-RECENT_GAPS:]
