"""Checkpoint budgets and the trigger: the seed's numbers, and how they scale."""

from __future__ import annotations

import pytest

from schemas.checkpoint.budgets import CheckpointBudgets, cut_to_tokens
from schemas.checkpoint.policy import (
    Fit,
    ModelWindow,
    checkpoint_threshold,
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
    assert checkpoint_threshold(200_000, 8_192) == 180_000
    assert checkpoint_threshold(1_000_000, 8_192) == 900_000


def test_threshold_keeps_reply_room_and_margin() -> None:
    # 64k output: the reply reserve is capped at 20k, the margin is a twentieth (10k).
    assert checkpoint_threshold(200_000, 64_000) == 200_000 - 20_000 - 10_000
    # A small window with a large output: the reserve takes at most a quarter of it.
    assert checkpoint_threshold(8_000, 8_192) == 8_000 - 2_000 - 400


def test_threshold_respects_price_step() -> None:
    assert checkpoint_threshold(1_000_000, 8_192, price_step_tokens=200_000) == 190_000
    b = CheckpointBudgets.for_window(1_000_000, 8_192, price_step_tokens=200_000)
    assert b.threshold == 190_000
    assert b.skills_total == 20_000  # budgets follow the price step, not the whole window


def test_explicit_safety_margin() -> None:
    assert checkpoint_threshold(200_000, 8_192, safety_margin=30_000) == 200_000 - 8_192 - 30_000
    assert default_safety_margin(1_000_000) == 13_000
    assert default_safety_margin(100_000) == 5_000


def test_room_is_needed_only_past_threshold() -> None:
    model = ModelWindow(context_window=200_000, max_output_tokens=8_192)
    assert model.threshold == 180_000
    assert fit(180_000, model) is Fit.FITS
    assert fit(180_001, model) is Fit.OVER_THRESHOLD
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
