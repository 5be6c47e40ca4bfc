"""The now: exactly one checkpoint block, long enough to continue from."""

from __future__ import annotations

from schemas.checkpoint.budgets import CheckpointBudgets
from schemas.checkpoint.now import NOW_GUIDE, extract_now, now_problems
from schemas.checkpoint.problems import ProblemKind
from tests.checkpoint.samples import NOW

BUDGETS = CheckpointBudgets()


def test_one_block_is_extracted_and_stripped() -> None:
    text = f"I took the checkpoint.\n<checkpoint>\n{NOW}\n</checkpoint>\n"
    assert extract_now(text) == NOW
    assert now_problems(text, BUDGETS) == []


def test_tags_are_case_insensitive() -> None:
    assert extract_now(f"<CHECKPOINT>{NOW}</Checkpoint>") == NOW


def test_no_block() -> None:
    (p,) = now_problems(NOW, BUDGETS)
    assert p.kind == ProblemKind.NOW_MISSING and p.part == "now"
    assert extract_now(NOW) is None


def test_unclosed_block_is_missing_and_says_so() -> None:
    (p,) = now_problems(f"<checkpoint>{NOW}", BUDGETS)
    assert p.kind == ProblemKind.NOW_MISSING and "never closed" in p.message


def test_two_blocks() -> None:
    text = f"<checkpoint>{NOW}</checkpoint>\n<checkpoint>{NOW}</checkpoint>"
    (p,) = now_problems(text, BUDGETS)
    assert p.kind == ProblemKind.NOW_MULTIPLE and "2" in p.message
    assert extract_now(text) is None


def test_tag_mentioned_in_prose_counts_as_more_than_one() -> None:
    text = f"Here is the <checkpoint> block:\n<checkpoint>{NOW}</checkpoint>"
    assert now_problems(text, BUDGETS)[0].kind == ProblemKind.NOW_MULTIPLE
    assert extract_now(text) is None


def test_too_short() -> None:
    text = "<checkpoint>Reviewing #482.</checkpoint>"
    (p,) = now_problems(text, BUDGETS)
    assert p.kind == ProblemKind.NOW_TOO_SHORT
    assert "15 characters" in p.message and str(BUDGETS.now_min_chars) in p.message
    assert extract_now(text) == "Reviewing #482."  # readable, but not usable


def test_guide_names_everything_the_now_holds() -> None:
    for needle in (
        "Current step",
        "workstream",
        "done",
        "in progress",
        "blocked",
        "Waiting on",
        "background commands",
        "Watches",
        "Tasks",
        "delegated runs",
        "questions to the",
        "id",
        "latest explicit request",
        "quote",
        "exact error text",
        "paths",
        "commands",
        "values",
    ):
        assert needle in NOW_GUIDE, needle
