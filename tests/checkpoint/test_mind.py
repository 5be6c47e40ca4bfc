"""The mind: template, reading, every check, and the cut shown when a section is too long."""

from __future__ import annotations

import pytest

from schemas.checkpoint.budgets import CheckpointBudgets
from schemas.checkpoint.mind import (
    BUDGETED_SECTIONS,
    CUT_MARKER_PREFIX,
    CUT_NOTE_PREFIX,
    TEMPLATE_HEADINGS,
    MindDocument,
    cut_sections,
    entry_survives,
    mission_entry_core,
)
from schemas.checkpoint.problems import ProblemKind
from schemas.edits import EditError, apply_exact_edit
from tests.checkpoint.samples import FILLED

BUDGETS = CheckpointBudgets()


def filled() -> MindDocument:
    return MindDocument(text=FILLED)


def kinds(problems: list) -> list[ProblemKind]:
    return [p.kind for p in problems]


# --- template and reading ----------------------------------------------------------------


def test_template_has_every_heading_in_order_with_guidance() -> None:
    t = MindDocument.template()
    assert t.headings() == [
        "# Mind",
        "## Where I stand",
        "## Goals",
        "### Mission",
        "### Workstreams",
        "## Key decisions",
        "## Lessons",
    ]
    for h in TEMPLATE_HEADINGS[1:]:
        assert h.guidance and h.guidance.startswith("_") and h.guidance in t.text
    text = t.text
    assert "never deleted" in text and "status" in text
    assert "how to report, when to ask, what I may decide" in text
    assert "authorized" in text and "reason" in text and "Principles" in text
    assert "queue" in text and "next" in text


def test_template_is_valid_against_itself_and_costs_nothing() -> None:
    t = MindDocument.template()
    assert t.validate(t, BUDGETS) == []
    assert t.section_tokens() == dict.fromkeys(BUDGETED_SECTIONS, 0)
    assert t.mission_entries() == []
    # Guidance is free even on the smallest window.
    assert t.validate(t, CheckpointBudgets.for_window(1_000, 8_192)) == []


def test_sections_and_section_text() -> None:
    m = filled()
    s = m.sections()
    assert list(s) == [
        "Mind",
        "Where I stand",
        "Goals",
        "Mission",
        "Workstreams",
        "Key decisions",
        "Lessons",
    ]
    assert "Ana's pull requests" in s["Where I stand"]
    assert "PR queue" not in s["Goals"]  # own text only
    assert "PR queue" in (m.section_text("Goals") or "")
    assert "oldest first" in (m.section_text("Goals") or "")
    assert m.section_text("Nope") is None


def test_mission_entries_ignore_guidance_and_join_wrapped_lines() -> None:
    assert filled().mission_entries() == [
        "- Work through the PR queue oldest first",
        "- Keep the billing tests green\n  on every branch",
    ]


def test_mission_entries_variants() -> None:
    text = FILLED.replace(
        "- Work through the PR queue oldest first\n",
        "1. Numbered entry\n* Starred entry\n  - a sub-bullet is not an entry\n",
    )
    entries = MindDocument(text=text).mission_entries()
    assert entries[:2] == ["1. Numbered entry", "* Starred entry"]
    assert len(entries) == 3


def test_section_tokens_count_only_what_the_model_wrote() -> None:
    tokens = filled().section_tokens()
    assert all(t > 0 for t in tokens.values())
    assert tokens["Goals"] > tokens["Lessons"]


@pytest.mark.parametrize(
    ("entry", "core"),
    [
        ("- Ship v2", "Ship v2"),
        ("- [done] Ship v2", "Ship v2"),
        ("- [x] Ship v2", "Ship v2"),
        ("- Ship v2 (status: done)", "Ship v2"),
        ("- Ship v2 [withdrawn by the user]", "Ship v2"),
        ("- Ship v2 — replaced by Ship v3", "Ship v2"),
        ("- Done: Ship v2.", "Ship v2"),
        ("- ~~Ship v2~~ (done 2024-05-01)", "Ship v2"),
        ("- **Ship v2**", "Ship v2"),
        ("- Migrate the DB (Postgres 16)", "Migrate the DB (Postgres 16)"),
        ("- [done]", "[done]"),
    ],
)
def test_mission_entry_core(entry: str, core: str) -> None:
    assert mission_entry_core(entry) == core


def test_entry_survives_status_marks_but_not_rewording() -> None:
    prev = "- Keep the billing tests green\n  on every branch"
    assert entry_survives(prev, ["- [done] Keep the billing tests green on every branch"])
    assert entry_survives(prev, ["- Keep the billing tests green [done]\n  on every branch"])
    assert not entry_survives(prev, ["- Keep billing tests green on every branch"])
    assert not entry_survives(prev, ["- Keep the billing tests [not] green on every branch"])
    assert not entry_survives(prev, [])


# --- structure -----------------------------------------------------------------------------


def test_missing_heading() -> None:
    m = MindDocument(text=FILLED.replace("## Key decisions\n", ""))
    problems = m.validate(filled(), BUDGETS)
    assert kinds(problems) == [ProblemKind.HEADING_MISSING]
    assert "'## Key decisions' is missing" in problems[0].message
    assert problems[0].part == "mind"


def test_renamed_heading() -> None:
    m = MindDocument(text=FILLED.replace("## Goals\n", "## Goal\n"))
    problems = m.validate(filled(), BUDGETS)
    assert kinds(problems) == [ProblemKind.HEADING_RENAMED]
    assert "'## Goals' was changed to '## Goal'" in problems[0].message


def test_relevelled_heading_is_a_rename() -> None:
    m = MindDocument(text=FILLED.replace("### Mission\n", "## Mission\n"))
    problems = m.validate(filled(), BUDGETS)
    assert ProblemKind.HEADING_RENAMED in kinds(problems)
    assert ProblemKind.HEADING_UNEXPECTED not in kinds(problems)


def test_duplicated_heading() -> None:
    m = MindDocument(text=FILLED + "\n## Lessons\n- again\n")
    problems = m.validate(filled(), BUDGETS)
    assert kinds(problems) == [ProblemKind.HEADING_DUPLICATED]
    assert "appears 2 times" in problems[0].message


def test_out_of_order_heading() -> None:
    where = FILLED.index("## Where I stand")
    goals = FILLED.index("## Goals")
    swapped = FILLED[:where] + FILLED[goals:].replace(
        "## Key decisions", FILLED[where:goals] + "## Key decisions"
    )
    problems = MindDocument(text=swapped).validate(filled(), BUDGETS)
    assert kinds(problems) == [ProblemKind.HEADING_OUT_OF_ORDER]
    assert "'## Where I stand'" in problems[0].message


def test_unexpected_top_heading_but_deeper_headings_allowed() -> None:
    m = MindDocument(text=FILLED + "\n## Notes\nstuff\n")
    assert kinds(m.validate(filled(), BUDGETS)) == [ProblemKind.HEADING_UNEXPECTED]
    deeper = MindDocument(text=FILLED.replace("- PR queue", "#### Queue\n- PR queue"))
    assert deeper.validate(filled(), BUDGETS) == []


def test_headings_in_code_fences_are_not_structure() -> None:
    m = MindDocument(text=FILLED + "```bash\n# run the migration check\n## not a heading\n```\n")
    assert m.validate(filled(), BUDGETS) == []
    assert m.headings() == filled().headings()


def test_every_structure_problem_is_listed() -> None:
    text = FILLED.replace("## Goal", "## Goal!").replace("## Lessons", "## Notes")
    problems = MindDocument(text=text).validate(filled(), BUDGETS)
    assert len(problems) >= 2


# --- mission -------------------------------------------------------------------------------


def test_deleting_a_mission_entry_is_reported_by_name() -> None:
    m = MindDocument(text=FILLED.replace("- Work through the PR queue oldest first\n", ""))
    problems = m.validate(filled(), BUDGETS)
    assert kinds(problems) == [ProblemKind.MISSION_FEWER_ENTRIES, ProblemKind.MISSION_ENTRY_MISSING]
    assert "2 entries" not in problems[0].message and "1 entries" in problems[0].message
    assert "'- Work through the PR queue oldest first'" in problems[1].message


def test_rewording_a_mission_entry_is_reported() -> None:
    m = MindDocument(text=FILLED.replace("oldest first", "newest first"))
    problems = m.validate(filled(), BUDGETS)
    assert kinds(problems) == [ProblemKind.MISSION_ENTRY_MISSING]
    assert "oldest first" in problems[0].message


def test_marking_status_and_adding_entries_is_fine() -> None:
    text = FILLED.replace(
        "- Work through the PR queue oldest first",
        "- [done] Work through the PR queue oldest first\n- Draft the release notes",
    )
    assert MindDocument(text=text).validate(filled(), BUDGETS) == []


def test_replacing_one_entry_by_another_keeps_the_count_but_not_the_words() -> None:
    m = MindDocument(text=FILLED.replace("Work through the PR queue oldest first", "Ship v2"))
    assert kinds(m.validate(filled(), BUDGETS)) == [ProblemKind.MISSION_ENTRY_MISSING]


def test_moving_an_entry_out_of_mission_is_reported() -> None:
    entry = "- Work through the PR queue oldest first\n"
    text = FILLED.replace(entry, "").replace("- PR queue", entry + "- PR queue")
    problems = MindDocument(text=text).validate(filled(), BUDGETS)
    assert ProblemKind.MISSION_ENTRY_MISSING in kinds(problems)


def test_edits_through_apply_exact_edit() -> None:
    text = apply_exact_edit(FILLED, "- Keep the billing", "- [done] Keep the billing")
    assert MindDocument(text=text).validate(filled(), BUDGETS) == []
    with pytest.raises(EditError):
        apply_exact_edit(FILLED, "", "# Mind\n")


# --- size ----------------------------------------------------------------------------------


def test_section_over_limit_names_section_tokens_and_limit() -> None:
    small = CheckpointBudgets.for_window(20_000, 4_000)  # Lessons limit 156
    lesson = "- Always measure before optimizing the hot path of the service.\n"
    m = MindDocument(text=FILLED + lesson * 18)
    problems = m.validate(filled(), small)
    over = [p for p in problems if p.kind == ProblemKind.SECTION_OVER_LIMIT]
    assert len(over) == 1 and over[0].section == "Lessons"
    tokens = m.section_tokens()["Lessons"]
    assert small.lessons < tokens <= 2 * small.lessons
    assert f"{tokens} tokens" in over[0].message and f"limit is {small.lessons}" in over[0].message


def test_section_past_twice_its_limit_is_a_section_over_its_limit() -> None:
    """One section far over its own limit, the whole within twice the total: the section
    is over its limit (shown cut), not a mind that grew past twice (kept previous)."""
    small = CheckpointBudgets.for_window(20_000, 4_000)
    m = MindDocument(text=FILLED + "- lesson words and more words\n" * 100)
    assert m.section_tokens()["Lessons"] > 2 * small.lessons
    assert m.total_tokens() <= 2 * small.mind_total_limit
    problems = m.validate(filled(), small)
    assert kinds(problems) == [ProblemKind.SECTION_OVER_LIMIT]
    assert problems[0].section == "Lessons" and "twice" in problems[0].message


def test_whole_mind_past_twice_counts_text_outside_sections() -> None:
    small = CheckpointBudgets.for_window(2_000, 8_192)  # total limit 200
    blob = "preamble words that sit outside every section " * 60
    m = MindDocument(text=FILLED.replace("# Mind\n", "# Mind\n" + blob + "\n"))
    problems = m.validate(filled(), small)
    assert any(p.kind == ProblemKind.MIND_GREW_PAST_TWICE and p.section is None for p in problems)


# --- cut -----------------------------------------------------------------------------------


def _without_keel_lines(text: str) -> MindDocument:
    lines = [
        x
        for x in text.split("\n")
        if not x.startswith(CUT_MARKER_PREFIX) and not x.startswith(CUT_NOTE_PREFIX)
    ]
    return MindDocument(text="\n".join(lines))


def test_cut_sections_cuts_each_over_limit_section_to_its_limit() -> None:
    small = CheckpointBudgets.for_window(20_000, 4_000)
    workstreams = "".join(
        f"- workstream {i}: reviewing module {i} of the queue\n" for i in range(40)
    )
    text = FILLED.replace("- PR queue: 3 of 12 reviewed; next #482\n", workstreams)
    text += "- lesson words and more words\n" * 80
    m = MindDocument(text=text)
    cut = cut_sections(m, small, "~/.keel/sessions/s1/mind-full.md")
    assert cut.rstrip().endswith(
        "The whole mind is in the read-only file ~/.keel/sessions/s1/mind-full.md.]"
    )
    assert "(Goals, Lessons)" in cut
    shown = _without_keel_lines(cut)
    assert shown.headings() == m.headings()
    assert shown.structure_problems() == []
    tokens = shown.section_tokens()
    assert tokens["Lessons"] <= small.lessons
    assert tokens["Goals"] <= small.goals + 2  # joins can cost a token
    assert tokens["Where I stand"] == m.section_tokens()["Where I stand"]  # untouched
    assert shown.mission_entries() == m.mission_entries()
    assert cut.count(CUT_MARKER_PREFIX) == 2


def test_cut_sections_never_cuts_mission() -> None:
    tiny = CheckpointBudgets.for_window(2_000, 8_192)  # Goals limit 50
    entries = "".join(f"- mission entry number {i} with several words\n" for i in range(10))
    m = MindDocument(text=FILLED.replace("- Keep the billing", entries + "- Keep the billing"))
    shown = _without_keel_lines(cut_sections(m, tiny, "/tmp/full.md"))
    assert shown.mission_entries() == m.mission_entries()
    assert "PR queue: 3 of 12" not in shown.text  # the rest of Goals gave way


def test_cut_sections_leaves_a_mind_within_limits_alone() -> None:
    assert cut_sections(filled(), BUDGETS, "/tmp/full.md") == FILLED
