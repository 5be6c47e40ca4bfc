"""The one dim line after a turn (keel.live.footer): context use, where the checkpoint
starts, how much of the turn's input the prompt cache held and how long it keeps it, the
model."""

from __future__ import annotations

from keel.live import footer
from schemas.events import TurnEnded
from schemas.model import OFFLINE_MODEL_NAME


def _ended(**kw: object) -> TurnEnded:
    return TurnEnded.model_validate({
        "session_id": "s", "at": "2026-12-06T05:00:00Z", "turn": 3, "model": "claude-sonnet-5",
        "context_tokens": 50_000,
        "context_window": 200_000, "checkpoint_threshold": 180_000, **kw})


def test_the_footer_says_what_the_cache_held_and_for_how_long() -> None:
    line = footer(_ended(cached_tokens=46_000, uncached_tokens=4_000, cache_ttl="1h"))
    assert line == ("context 25% (50,000 / 200,000) · checkpoint at 180,000 · cache 92% read,"
                    " kept 1h · claude-sonnet-5")


def test_no_cache_part_when_nothing_was_billed() -> None:
    assert "cache" not in (footer(_ended()) or "")
    assert footer(_ended(context_window=None)) is None


def test_the_offline_model_s_cache_is_said_as_the_api_s() -> None:
    """It caches as the API does (activities.offline.backend): its reads are shown too."""
    offline = _ended(model=OFFLINE_MODEL_NAME, cached_tokens=4_500, uncached_tokens=500,
                     cache_ttl="5m")
    assert "· cache 90% read, kept 5m · offline deterministic model" in (footer(offline) or "")
