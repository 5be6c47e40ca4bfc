"""The checkpoint put together: request, checks, repair, every fallback row, rendering."""

from __future__ import annotations

import re

from schemas.checkpoint import (
    CarriedSkill,
    CheckpointCheck,
    checkpoint_instruction,
    recent_files,
    render_checkpoint,
    repair_request,
    resolve_checkpoint,
    select_carried_skills,
    validate_checkpoint,
)
from schemas.checkpoint.budgets import CheckpointBudgets
from schemas.checkpoint.memo import (
    CHECKLIST_HEADER,
    IN_TURN_RULE,
    MemoAssembly,
    MemoCandidate,
    MemoEntry,
    render_checklist,
)
from schemas.checkpoint.mind import MindDocument
from schemas.checkpoint.now import NOW_GUIDE
from schemas.checkpoint.problems import Problem, ProblemKind
from schemas.messages import MessageType, RecordRow
from schemas.tokens import count_tokens
from tests.checkpoint.samples import FILLED, NOW

BUDGETS = CheckpointBudgets()
SMALL = CheckpointBudgets.for_window(20_000, 4_000)
FULL_PATH = "~/.keel/sessions/s1/mind-full-3.md"

CANDIDATES = [
    MemoCandidate(seq=3, text="Work through the PR queue, oldest first.", kept_before=True),
    MemoCandidate(seq=8, text="Never merge anything yourself."),
    MemoCandidate(seq=11, text="continue"),
]
CHECKLIST = render_checklist(CANDIDATES)
FINAL = f"Checkpoint taken.\n<checkpoint>\n{NOW}\n</checkpoint>"


def tick(text: str, seq: int, box: str = "x") -> str:
    return re.sub(rf"^- \[.\] #{seq} ", f"- [{box}] #{seq} ", text, flags=re.M)


def check(
    *,
    final: str = FINAL,
    mind: str = FILLED,
    previous: str = FILLED,
    edited: str = CHECKLIST,
    candidates: list[MemoCandidate] = CANDIDATES,
    budgets: CheckpointBudgets = BUDGETS,
) -> CheckpointCheck:
    return validate_checkpoint(
        final_text=final,
        mind=MindDocument(text=mind),
        previous_mind=MindDocument(text=previous),
        checklist_original=render_checklist(candidates),
        checklist_edited=edited,
        candidates=candidates,
        budgets=budgets,
    )


def resolve(
    c: CheckpointCheck,
    *,
    mind: str = FILLED,
    previous: str = FILLED,
    candidates: list[MemoCandidate] = CANDIDATES,
    exhausted: bool = False,
    budgets: CheckpointBudgets = BUDGETS,
):
    return resolve_checkpoint(
        check=c,
        mind=MindDocument(text=mind),
        previous_mind=MindDocument(text=previous),
        candidates=candidates,
        memo_untouched_rounds_exhausted=exhausted,
        budgets=budgets,
        full_mind_path=FULL_PATH,
    )


# --- validate_checkpoint -------------------------------------------------------------------


def test_a_valid_checkpoint() -> None:
    c = check(edited=tick(CHECKLIST, 11, " "))  # "continue" released
    assert c.ok and c.problems == []
    assert c.now_text == NOW
    assert c.ticked == [3, 8]
    assert not c.checklist_untouched and not c.checklist_changed


def test_every_problem_of_every_part_is_listed() -> None:
    broken_mind = FILLED.replace("## Goals\n", "## Goal\n").replace(
        "- Work through the PR queue oldest first\n", ""
    )
    edited = tick(CHECKLIST, 8).replace("oldest first", "newest first")
    c = check(final=NOW, mind=broken_mind, edited=edited)
    kinds = {p.kind for p in c.problems}
    assert {
        ProblemKind.NOW_MISSING,
        ProblemKind.HEADING_RENAMED,
        ProblemKind.MISSION_FEWER_ENTRIES,
        ProblemKind.MISSION_ENTRY_MISSING,
        ProblemKind.CHECKLIST_CHANGED,
    } <= kinds
    assert {p.part for p in c.problems} == {"now", "mind", "memo"}
    assert c.problems_in("now")[0].kind == ProblemKind.NOW_MISSING
    assert c.checklist_changed


def test_memo_over_budget_is_a_problem() -> None:
    many = [MemoCandidate(seq=i, text="words " * 400) for i in range(1, 20)]
    original = render_checklist(many)
    edited = original
    for i in range(1, 20):
        edited = tick(edited, i)
    c = check(edited=edited, candidates=many)
    assert [p.kind for p in c.problems] == [ProblemKind.MEMO_OVER_BUDGET]


# --- repair --------------------------------------------------------------------------------


def test_repair_request_names_every_problem_numbered() -> None:
    broken_mind = FILLED.replace("## Goals\n", "## Goal\n")
    c = check(final="no block", mind=broken_mind, edited=CHECKLIST.replace("#11", "#12"))
    request = repair_request(c.problems, mind_path="scratch/mind.md", memo_path="scratch/memo.md")
    assert len(c.problems) == 3
    for i, p in enumerate(c.problems, 1):
        assert f"{i}. [{p.part}] {p.message}" in request
    assert "3 problem(s)" in request
    assert "edit tool" in request and "exact replace" in request
    assert "not rewrite or overwrite" in request
    assert "only tick" in request
    assert "<checkpoint>" in request and "exactly one" in request
    assert "not from the user" in request
    assert "scratch/mind.md" in request and "scratch/memo.md" in request


def test_repair_request_only_explains_parts_with_problems() -> None:
    p = Problem(kind=ProblemKind.NOW_TOO_SHORT, part="now", message="the now is short")
    request = repair_request([p])
    assert "1. [now] the now is short" in request
    assert "edit tool" not in request and "only tick" not in request
    assert "<checkpoint>" in request


# --- the instruction -----------------------------------------------------------------------


def instruction(in_turn: list[int] | None = None) -> str:
    return checkpoint_instruction(
        mind_path="scratch/s1/mind.md",
        memo_path="scratch/s1/memo.md",
        mind_text=FILLED,
        checklist_text=CHECKLIST,
        budgets=BUDGETS,
        user_name="Ana",
        in_turn_user_seqs=in_turn or [],
    )


def test_instruction_says_it_comes_from_keel_not_the_user() -> None:
    text = instruction()
    assert text.startswith("[Keel: checkpoint request]")
    assert "comes from Keel" in text and "not from Ana" in text
    assert "never record it, quote it or act on it as something Ana said" in text
    assert "Only messages Ana typed are Ana's words" in text
    assert "[Harness:" in text and "background" in text


def test_instruction_lists_both_files_with_their_text() -> None:
    text = instruction()
    assert "scratch/s1/mind.md" in text and "scratch/s1/memo.md" in text
    assert FILLED in text and CHECKLIST in text


def test_instruction_explains_rules_and_limits() -> None:
    text = instruction()
    for name, limit in BUDGETS.section_limits().items():
        assert f"{name} (at most {limit} tokens" in text
    assert "never deleted" in text and "mark its status on" in text
    assert "edit tool" in text and "exact replace" in text and "Never overwrite" in text
    assert "Only tick" in text and "never retype" in text
    assert "exactly one <checkpoint>...</checkpoint> block" in text
    assert NOW_GUIDE in text
    assert f"at most {BUDGETS.max_tool_rounds} rounds of tool calls" in text
    assert str(BUDGETS.memo_total) in text and str(BUDGETS.memo_per_message) in text


def test_instruction_names_in_turn_messages() -> None:
    assert "messages of the turn in progress: #21, #23." in instruction([21, 23])
    assert "messages of the turn in progress:" not in instruction([])


def test_instruction_and_checklist_state_one_in_turn_rule() -> None:
    # The instruction and the checklist it shows say the same of a turn's own messages,
    # and neither says they are in the checklist.
    rule = " ".join(IN_TURN_RULE.split())
    assert rule in " ".join(instruction([21]).split())
    header = " ".join(" ".join(line.lstrip("# ") for line in CHECKLIST_HEADER).split())
    assert rule in header


# --- fallbacks -----------------------------------------------------------------------------


def test_valid_checkpoint_resolves_without_fallbacks() -> None:
    out = resolve(check(edited=tick(CHECKLIST, 11, " ")))
    assert not out.failed and out.fallbacks == []
    assert out.now_text == NOW
    assert out.mind_record_text == out.mind_context_text == FILLED
    assert out.kept_seqs == [3, 8]
    assert [e.seq for e in out.memo.entries] == [3, 8]
    assert out.memo.entries[1].text == "Never merge anything yourself."


def test_no_usable_now_fails() -> None:
    for final in ("no block at all", "<checkpoint>short</checkpoint>", FINAL + FINAL):
        out = resolve(check(final=final))
        assert out.failed and out.reason and out.reason.startswith("no usable now")
        assert out.mind_record_text is None and out.memo.entries == []
        assert out.fallbacks


def test_lost_structure_keeps_previous_mind() -> None:
    broken = FILLED.replace("## Lessons\n", "")
    out = resolve(check(mind=broken), mind=broken)
    assert out.mind_kept_previous
    assert out.mind_record_text == out.mind_context_text == FILLED
    assert any("lost its structure" in f for f in out.fallbacks)


def test_deleted_mission_entry_keeps_previous_mind() -> None:
    broken = FILLED.replace("- Keep the billing tests green\n  on every branch\n", "")
    out = resolve(check(mind=broken), mind=broken)
    assert out.mind_kept_previous and out.mind_record_text == FILLED


def test_mind_past_twice_its_limits_keeps_previous_mind() -> None:
    grown = FILLED + "- lesson words and more words\n" * 300
    assert MindDocument(text=grown).total_tokens() > 2 * SMALL.mind_total_limit
    c = check(mind=grown, budgets=SMALL)
    out = resolve(c, mind=grown, budgets=SMALL)
    assert out.mind_kept_previous and out.mind_record_text == FILLED
    assert any("grew past twice" in f for f in out.fallbacks)


def test_section_at_three_times_its_limit_keeps_whole_mind_shown_cut() -> None:
    """More rather than less: one section at 3x its limit, the whole within twice the
    total, keeps every new edit in the record and shows that section cut."""
    grown = FILLED + "- lesson words and more words\n" * 80
    doc = MindDocument(text=grown)
    assert doc.section_tokens()["Lessons"] > 3 * SMALL.lessons
    assert doc.total_tokens() <= 2 * SMALL.mind_total_limit
    c = check(mind=grown, budgets=SMALL)
    out = resolve(c, mind=grown, budgets=SMALL)
    assert not out.mind_kept_previous and out.mind_cut
    assert out.mind_record_text == grown
    assert FULL_PATH in (out.mind_context_text or "")
    assert any("over its limits" in f for f in out.fallbacks)


def test_section_over_limit_keeps_whole_mind_and_shows_it_cut() -> None:
    grown = FILLED + "- Always measure before optimizing the hot path of the service.\n" * 18
    c = check(mind=grown, budgets=SMALL)
    assert [p.kind for p in c.problems] == [ProblemKind.SECTION_OVER_LIMIT]
    out = resolve(c, mind=grown, budgets=SMALL)
    assert not out.mind_kept_previous and out.mind_cut
    assert out.mind_record_text == grown
    assert out.mind_context_text != grown and FULL_PATH in (out.mind_context_text or "")
    assert "read-only" in (out.mind_context_text or "")
    assert any("over its limits" in f and "Lessons" in f for f in out.fallbacks)


def test_previous_mind_over_new_limits_is_shown_cut() -> None:
    # The model's mind lost structure; the previous one is kept, but it is over this
    # (smaller) window's limits, so the context shows it cut.
    previous = FILLED + "- Always measure before optimizing the hot path of the service.\n" * 18
    broken = previous.replace("## Lessons\n", "")
    c = check(mind=broken, previous=previous, budgets=SMALL)
    out = resolve(c, mind=broken, previous=previous, budgets=SMALL)
    assert out.mind_kept_previous and out.mind_record_text == previous
    assert out.mind_cut and FULL_PATH in (out.mind_context_text or "")


def test_memo_changed_beyond_boxes_keeps_every_candidate() -> None:
    edited = CHECKLIST.replace("continue", "carry on")
    out = resolve(check(edited=edited))
    assert out.kept_seqs == [3, 8, 11]
    assert [e.seq for e in out.memo.entries] == [3, 8, 11]
    assert any("changed beyond its checkboxes" in f for f in out.fallbacks)


def test_memo_untouched_when_rounds_ran_out_keeps_every_candidate() -> None:
    out = resolve(check(), exhausted=True)
    assert out.kept_seqs == [3, 8, 11]
    assert any("tool rounds ran out" in f for f in out.fallbacks)


def test_memo_untouched_by_choice_keeps_what_was_kept() -> None:
    # Every candidate comes ticked: a writer that leaves the checklist as it is keeps all.
    out = resolve(check())
    assert out.kept_seqs == [3, 8, 11] and out.fallbacks == []


def test_rounds_ran_out_after_ticking_keeps_the_ticks() -> None:
    out = resolve(check(edited=tick(tick(CHECKLIST, 3, " "), 11, " ")), exhausted=True)
    assert out.kept_seqs == [8]


def test_kept_over_budget_is_shortened() -> None:
    many = [MemoCandidate(seq=i, text=f"rule {i}: " + "words " * 400) for i in range(1, 200)]
    edited = render_checklist(many)
    for i in range(1, 200):
        edited = tick(edited, i)
    c = check(edited=edited, candidates=many)
    out = resolve(c, candidates=many)
    assert not out.failed
    assert out.kept_seqs == list(range(1, 200))
    assert out.memo.total_tokens <= BUDGETS.memo_total
    assert out.memo.entries[0].seq == 1 and out.memo.entries[-1].seq == 199
    assert out.memo.dropped_seqs
    assert any("memo:" in f and "shortened evenly" in f for f in out.fallbacks)
    assert any("left in the record" in f for f in out.fallbacks)


# --- skills and files ----------------------------------------------------------------------


def skill(name: str, seq: int, words: int) -> CarriedSkill:
    return CarriedSkill(name=name, text=f"# {name}\n" + "step words " * words, loaded_seq=seq)


def test_skills_most_recent_first_each_cut_total_bounded() -> None:
    skills = [
        skill("old", 1, 100),
        skill("big", 5, 4_000),
        skill("new", 9, 50),
        skill("old", 3, 20),
    ]
    chosen = select_carried_skills(skills, BUDGETS)
    assert [s.name for s in chosen] == ["new", "big", "old"]
    assert chosen[2].loaded_seq == 3  # the latest load of a skill counts
    big = chosen[1]
    assert big.cut and count_tokens(big.text) <= BUDGETS.skills_each
    assert not chosen[0].cut
    assert sum(count_tokens(s.text) for s in chosen) <= BUDGETS.skills_total


def test_skills_total_and_count_limits() -> None:
    many = [skill(f"s{i}", i, 1_000) for i in range(40)]
    chosen = select_carried_skills(many, BUDGETS)
    assert sum(count_tokens(s.text) for s in chosen) <= BUDGETS.skills_total
    assert chosen[0].name == "s39"
    few = select_carried_skills([skill(f"t{i}", i, 5) for i in range(40)], BUDGETS)
    assert len(few) == BUDGETS.skills_max_count == 20
    assert few[-1].name == "t20"


def _file_calls(seq: int, *calls: tuple[str, str]) -> RecordRow:
    return RecordRow(seq=seq, type=MessageType.ASSISTANT, text="", content=[
        {"type": "tool_use", "id": f"t{seq}-{i}", "name": name, "input": {"path": path}}
        for i, (name, path) in enumerate(calls)])


def test_recent_files() -> None:
    moving = [
        _file_calls(1, ("read_file", "c.py"), ("write_file", "out.md")),
        _file_calls(2, ("read_file", "a.py"), ("load_skill", "x")),
        _file_calls(3, ("read_file", "b.py"), ("edit_file", "old.md")),
        _file_calls(4, ("read_file", "a.py")),
    ]
    found = recent_files(moving, modified_before=["old.md", "first.md"], read_before=[],
                         budgets=CheckpointBudgets())
    assert found.read == ["a.py", "b.py", "c.py"]
    assert found.modified == ["old.md", "out.md", "first.md"]
    assert not found.pushed_out
    few = recent_files(moving, modified_before=[], read_before=[],
                       budgets=CheckpointBudgets(files_read=2))
    assert (few.read, few.pushed_out) == (["a.py", "b.py"], True)


# --- rendering -----------------------------------------------------------------------------


def render(in_turn: list[int] | None = None, memo: MemoAssembly | None = None) -> str:
    memo = memo or MemoAssembly(
        entries=[
            MemoEntry(seq=3, text="Work through the PR queue, oldest first."),
            MemoEntry(seq=8, text="Never merge", cut=True),
        ],
        dropped_seqs=[5],
    )
    skills = select_carried_skills([skill("review", 40, 4_000), skill("git", 30, 10)], BUDGETS)
    return render_checkpoint(
        mind_text=FILLED,
        memo=memo,
        now_text=NOW,
        skills=skills,
        files_modified=["src/billing.py", "tests/test_billing.py"],
        files_read=["README.md"],
        files_pushed_out=True,
        record_hint="Earlier messages are in the record: keel record s1 --type user",
        in_turn_user_seqs=in_turn or [],
        user_name="Ana",
    )


def test_rendered_checkpoint_is_a_recollection_for_reference() -> None:
    text = render()
    assert "my own recollection" in text
    assert "reference, not new instructions" in text
    assert "the newest messages win" in text
    assert "Ana's words and our agreements recorded in it still apply" in text
    assert "<checkpoint>" not in text  # never mistaken for a now block


def test_rendered_checkpoint_has_every_part() -> None:
    text = render()
    assert FILLED.strip() in text
    assert "#3:\nWork through the PR queue, oldest first." in text
    assert "#8:\nNever merge\n[cut: the full text is message #8 of the record]" in text
    assert "#5" in text
    assert NOW in text
    assert text.index('<skill name="review"') < text.index('<skill name="git"')
    assert '[cut: load all of it with the load_skill tool, name "review"]' in text
    assert "Modified: src/billing.py, tests/test_billing.py" in text
    assert "Read: README.md" in text and "pushed out" in text
    assert "keel record s1 --type user" in text
    assert text.index("## My mind") < text.index("own words") < text.index("## Now")


def test_in_turn_messages_are_the_current_request() -> None:
    text = render([21, 23])
    assert "#21, #23" in text
    assert "They are the current request" in text and "they win" in text
    assert "current request" not in render([])


def test_empty_memo_renders_a_note() -> None:
    text = render(memo=MemoAssembly())
    assert "No earlier message is kept here" in text
