"""Checkpoint budgets and the trigger: the seed's numbers, and how they scale."""

from __future__ import annotations

import pytest

from schemas.checkpoint.budgets import CheckpointBudgets, cut_to_tokens
from schemas.checkpoint.policy import (
    CheckpointView,
    Fit,
    ModelWindow,
    checkpoint_reply_room,
    checkpoint_rounds_room,
    checkpoint_threshold,
    checkpoint_turn_room,
    checkpoint_view,
    default_safety_margin,
    fit,
)
from schemas.tokens import count_tokens


def test_defaults_are_a_200k_window() -> None:
    assert CheckpointBudgets.for_window(200_000, 8_192) == CheckpointBudgets()


def test_full_limits_at_192k_and_above() -> None:
    for window in (192_000, 200_000, 1_000_000):
        b = CheckpointBudgets.for_window(window, 8_192)
        assert b.section_limits() == {
            "Where I stand": 1_000,
            "Goals": 2_000,
            "Key decisions": 1_500,
            "Lessons": 1_500,
        }
        assert (b.memo_per_message, b.memo_total) == (300, 3_000)
        assert b.mind_total_limit == 6_000
        assert b.recent_tail == 20_000
        assert b.skills_each == 5_000
        assert (b.skills_max_count, b.files_modified, b.files_read) == (20, 10, 5)
        assert b.max_tool_rounds == 5


def test_limits_shrink_in_proportion_below_192k() -> None:
    b = CheckpointBudgets.for_window(96_000, 8_192)
    assert b.section_limits() == {
        "Where I stand": 500,
        "Goals": 1_000,
        "Key decisions": 750,
        "Lessons": 750,
    }
    assert (b.memo_per_message, b.memo_total) == (150, 1_500)


def test_tiny_window_keeps_floors() -> None:
    b = CheckpointBudgets.for_window(2_000, 8_192)
    assert set(b.section_limits().values()) == {50}
    assert b.memo_per_message == 40
    assert b.memo_total >= b.memo_per_message
    assert b.recent_tail == b.threshold // 4


def test_skills_total_is_smaller_of_25k_and_a_tenth_of_window() -> None:
    assert CheckpointBudgets.for_window(1_000_000, 8_192).skills_total == 25_000
    assert CheckpointBudgets.for_window(200_000, 8_192).skills_total == 20_000
    small = CheckpointBudgets.for_window(20_000, 4_000)
    assert small.skills_total == 2_000
    assert small.skills_each == 2_000  # never more than the total


def test_threshold_is_90_percent_of_a_large_window() -> None:
    assert checkpoint_threshold(1_000_000, 8_192) == 900_000


def test_threshold_keeps_room_for_the_checkpoint_turn() -> None:
    """Issue 10: at 200k the 90% trigger left no room for the checkpoint turn (instruction,
    mind and memo at their limits, its reply); the trigger now keeps it beside the margin.
    Issue 20: and for the turn's later requests: its edits (one more reply), the notes
    between rounds and the one repair request."""
    room = checkpoint_turn_room(200_000, 8_192)
    first = 1_000 + 6_000 + 3_000 + 4_096
    assert room == first + checkpoint_rounds_room(4_096) == first + 4_096 + 100 + 400
    assert checkpoint_threshold(200_000, 8_192) == 200_000 - room - 10_000
    for window, output in [(8_000, 512), (16_000, 512), (32_000, 1_024), (128_000, 8_192),
                           (200_000, 8_192), (1_000_000, 32_000)]:
        threshold = checkpoint_threshold(window, output)
        margin = default_safety_margin(window)
        # A context at the threshold plus the whole checkpoint turn still fits the window,
        # with the margin left for the estimate's error and one more tool output.
        assert threshold + checkpoint_turn_room(window, output) + margin <= window


def test_checkpoint_reply_room_is_short() -> None:
    assert checkpoint_reply_room(200_000, 64_000) == 4_096
    assert checkpoint_reply_room(200_000, 512) == 512
    assert checkpoint_reply_room(8_000, 8_192) == 1_000


def test_checkpoint_view_takes_the_most_that_fits() -> None:
    assert checkpoint_view(900, 500, [], 1_000) == (CheckpointView.FULL, None)
    assert checkpoint_view(1_200, 900, [], 1_000) == (CheckpointView.WITHOUT_NEWEST_OUTPUT,
                                                      None)
    earlier = [(10, 300), (20, 700), (30, 990), (40, 1_100)]
    # The largest earlier part that fits, not a fixed half.
    assert checkpoint_view(1_500, 1_400, earlier, 1_000) == (CheckpointView.EARLIER, 30)
    assert checkpoint_view(1_500, None, [(10, 1_100)], 1_000) == (CheckpointView.NONE, None)


def test_threshold_keeps_reply_room_and_margin() -> None:
    # 64k output: the reply reserve is capped at 20k, the margin is a twentieth (10k).
    assert checkpoint_threshold(200_000, 64_000) == 200_000 - 20_000 - 10_000
    # A small window with a large output: the reserve takes at most a quarter of it, and
    # the checkpoint turn's reply room at most an eighth.
    assert checkpoint_threshold(8_000, 8_192) == 8_000 - checkpoint_turn_room(8_000, 8_192) - 400
    assert checkpoint_turn_room(8_000, 8_192) < 2_000 + 400 + 1_000 + 100


def test_threshold_respects_price_step() -> None:
    assert checkpoint_threshold(1_000_000, 8_192, price_step_tokens=200_000) == 190_000
    b = CheckpointBudgets.for_window(1_000_000, 8_192, price_step_tokens=200_000)
    assert b.threshold == 190_000
    assert b.skills_total == 20_000  # budgets follow the price step, not the whole window


def test_explicit_safety_margin() -> None:
    assert checkpoint_threshold(200_000, 8_192, safety_margin=30_000) == (
        200_000 - checkpoint_turn_room(200_000, 8_192) - 30_000)
    assert default_safety_margin(1_000_000) == 13_000
    assert default_safety_margin(100_000) == 5_000


def test_room_is_needed_only_past_threshold() -> None:
    model = ModelWindow(context_window=200_000, max_output_tokens=8_192)
    assert model.threshold == 171_308
    assert fit(171_308, model) is Fit.FITS
    assert fit(171_309, model) is Fit.OVER_THRESHOLD
    assert fit(0, model) is Fit.FITS
    assert fit(200_000 - 8_192 + 1, model) is Fit.OVER_LIMIT


def test_section_limit_by_heading_or_field_name() -> None:
    b = CheckpointBudgets()
    assert b.section_limit("Key decisions") == 1_500
    assert b.section_limit("key_decisions") == 1_500
    assert b.section_limit("Where I stand") == 1_000
    with pytest.raises(KeyError):
        b.section_limit("Mission")


def test_carried_total_fits_under_threshold() -> None:
    for window in (1_000, 2_000, 8_000, 32_000, 200_000, 2_000_000):
        b = CheckpointBudgets.for_window(window, 8_192)
        assert b.carried_total < b.threshold


@pytest.mark.parametrize(
    "text",
    ["plain words " * 50, "héllo 世界 🎉🎉 wörld " * 20, "日本語のテキスト" * 40, "🎉" * 100],
)
def test_cut_to_tokens_is_a_prefix_within_limit(text: str) -> None:
    for limit in range(0, 40):
        cut = cut_to_tokens(text, limit)
        assert text.startswith(cut)
        assert count_tokens(cut) <= limit


def test_cut_to_tokens_leaves_short_text_alone() -> None:
    assert cut_to_tokens("short", 10) == "short"
    assert cut_to_tokens("", 10) == ""
    assert cut_to_tokens("anything", 0) == ""
