"""The memo: the checklist the model ticks, its parsing, and the assembly from the record."""

from __future__ import annotations

import pytest

from schemas.checkpoint.budgets import CheckpointBudgets
from schemas.checkpoint.memo import (
    CHECKLIST_HEADER,
    MemoCandidate,
    assemble_memo,
    cut_note,
    memo_problems,
    parse_checklist,
    preview,
    render_checklist,
)
from schemas.checkpoint.problems import ProblemKind
from schemas.tokens import count_tokens

BUDGETS = CheckpointBudgets()


def cand(seq: int, text: str, kept_before: bool = False) -> MemoCandidate:
    return MemoCandidate(seq=seq, text=text, tokens=count_tokens(text), kept_before=kept_before)


CANDIDATES = [
    cand(7, "Only interrupt me when a PR needs my decision.", kept_before=True),
    cand(3, "Work through the PR queue, oldest first.\nDo not merge anything yourself."),
    cand(12, "continue"),
    cand(15, "x" * 200),
]


def checklist() -> str:
    return render_checklist(CANDIDATES)


def flip(text: str, seq: int, box: str) -> str:
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if f"] #{seq} " in line:
            lines[i] = line[:3] + box + line[4:]
    return "\n".join(lines)


# --- rendering -----------------------------------------------------------------------------


def test_checklist_header_explains_keep_release_skip() -> None:
    header = "\n".join(CHECKLIST_HEADER)
    for word in ("Keep", "Release", "ticked", "constraint", "permission", "continue", "record"):
        assert word in header
    assert checklist().startswith(header)


def test_checklist_lines_in_seq_order_with_boxes() -> None:
    lines = [x for x in checklist().split("\n") if x.startswith("- [")]
    # Every candidate comes ticked: only the model's release drops a user's message.
    assert (
        lines[0]
        == "- [x] #3 Work through the PR queue, oldest first. Do not merge anything yourself."
    )
    assert lines[1] == "- [x] #7 Only interrupt me when a PR needs my decision."
    assert lines[2] == "- [x] #12 continue"
    assert lines[3].startswith("- [x] #15 xxx") and lines[3].endswith("…")


def test_preview() -> None:
    assert preview("a\n\n b\tc") == "a b c"
    assert len(preview("word " * 100)) <= 80
    assert preview("word " * 100).endswith("…")
    assert preview("   ") == "(empty message)"


# --- parsing -------------------------------------------------------------------------------


def test_untouched_checklist() -> None:
    result = parse_checklist(checklist(), checklist())
    assert result.untouched and result.problems == []
    assert result.ticked == [3, 7, 12, 15]


def test_checkbox_flips_are_accepted() -> None:
    edited = flip(flip(flip(checklist(), 15, " "), 7, " "), 12, "X")
    result = parse_checklist(checklist(), edited)
    assert result.problems == [] and not result.untouched
    assert result.ticked == [3, 12]
    # Released, then kept again after all.
    assert parse_checklist(checklist(), flip(flip(checklist(), 3, " "), 3, "x")).ticked == [
        3, 7, 12, 15]


def test_trailing_newline_and_crlf_are_not_changes() -> None:
    edited = flip(flip(checklist(), 12, " "), 15, " ").rstrip("\n").replace("\n", "\r\n")
    result = parse_checklist(checklist(), edited)
    assert result.problems == [] and result.ticked == [3, 7]


def test_editing_a_preview_is_reported_with_its_line() -> None:
    edited = checklist().replace("oldest first", "newest first")
    result = parse_checklist(checklist(), edited)
    assert len(result.problems) == 1
    p = result.problems[0]
    assert p.kind == ProblemKind.CHECKLIST_CHANGED and p.part == "memo"
    assert p.line == len(CHECKLIST_HEADER) + 2 and p.seq == 3
    assert f"line {p.line}" in p.message and "beyond its checkbox" in p.message


def test_editing_the_header_is_reported() -> None:
    edited = checklist().replace("Release instructions", "Ignore instructions")
    result = parse_checklist(checklist(), edited)
    line = next(i for i, h in enumerate(CHECKLIST_HEADER, 1)
                if h.startswith("# Release instructions"))
    assert [p.line for p in result.problems] == [line]


def test_removed_added_and_moved_lines_are_reported() -> None:
    lines = checklist().split("\n")
    first = len(CHECKLIST_HEADER) + 1
    removed = "\n".join(lines[:first] + lines[first + 1 :])
    assert "was removed" in parse_checklist(checklist(), removed).problems[0].message
    added = checklist() + "- [x] #99 my own line\n"
    assert "was added" in parse_checklist(checklist(), added).problems[0].message
    moved = lines[:]
    moved[first], moved[first + 1] = moved[first + 1], moved[first]
    result = parse_checklist(checklist(), "\n".join(moved))
    assert len(result.problems) == 1 and "was moved" in result.problems[0].message


def test_a_box_may_hold_only_space_or_x() -> None:
    result = parse_checklist(checklist(), flip(checklist(), 3, "v"))
    assert len(result.problems) == 1
    assert "box holds 'v'" in result.problems[0].message


def test_ticks_survive_alongside_problems() -> None:
    edited = flip(checklist(), 12, " ").replace("Release instructions", "Ignore instructions")
    result = parse_checklist(checklist(), edited)
    assert result.changed_beyond_boxes
    assert 12 not in result.ticked and 3 in result.ticked


# --- assembly ------------------------------------------------------------------------------


def test_short_messages_are_copied_verbatim_in_seq_order() -> None:
    kept = [cand(9, "second"), cand(2, "first  with\n odd  spacing ")]
    memo = assemble_memo(kept, BUDGETS)
    assert [(e.seq, e.text, e.cut) for e in memo.entries] == [
        (2, "first  with\n odd  spacing ", False),
        (9, "second", False),
    ]
    assert memo.fallbacks == [] and memo.dropped_seqs == []
    assert memo.total_tokens == count_tokens("first  with\n odd  spacing ") + 1


def test_long_message_is_cut_with_a_note() -> None:
    text = "The constraint is this. " * 100
    memo = assemble_memo([cand(5, text)], BUDGETS)
    (entry,) = memo.entries
    assert entry.cut and text.startswith(entry.text)
    assert count_tokens(entry.text) <= BUDGETS.memo_per_message
    assert entry.note == cut_note(5) == "[cut: the full text is message #5 of the record]"
    assert cut_note(5) in memo.render()


def test_over_total_is_shortened_evenly_short_ones_keep_their_size() -> None:
    short = cand(1, "keep tests green")
    longs = [cand(i, f"message {i} " + "detail words here " * 120) for i in range(2, 14)]
    memo = assemble_memo([short, *longs], BUDGETS)
    assert memo.entries[0].text == short.text and not memo.entries[0].cut
    sizes = [count_tokens(e.text) for e in memo.entries[1:]]
    assert max(sizes) - min(sizes) <= 2
    assert all(e.cut for e in memo.entries[1:])
    assert memo.total_tokens <= BUDGETS.memo_total
    assert memo.dropped_seqs == []
    assert any("shortened evenly" in f for f in memo.fallbacks)


def test_past_the_floor_first_and_newest_are_kept() -> None:
    many = [cand(i, f"message {i} " + "detail words here " * 60) for i in range(1, 201)]
    memo = assemble_memo(many, BUDGETS)
    seqs = [e.seq for e in memo.entries]
    assert seqs[0] == 1
    assert seqs[-1] == 200
    assert seqs[1:] == list(range(200 - len(seqs) + 2, 201))  # a newest run
    assert all(count_tokens(e.text) >= BUDGETS.memo_share_floor - 1 for e in memo.entries)
    assert memo.total_tokens <= BUDGETS.memo_total
    assert memo.dropped_seqs == list(range(2, 200 - len(seqs) + 2))
    assert any("left in the record" in f for f in memo.fallbacks)
    rendered = memo.render()
    assert "#2, #3" in rendered and "record" in rendered


def test_duplicate_candidates_count_once() -> None:
    memo = assemble_memo([cand(4, "same"), cand(4, "same")], BUDGETS)
    assert [e.seq for e in memo.entries] == [4]


def test_empty_memo() -> None:
    memo = assemble_memo([], BUDGETS)
    assert memo.entries == [] and memo.total_tokens == 0 and memo.render() == ""


@pytest.mark.parametrize("window", [1_000, 8_000, 50_000, 200_000])
def test_memo_problems_over_budget(window: int) -> None:
    b = CheckpointBudgets.for_window(window, 8_192)
    fits = [cand(1, "short")]
    assert memo_problems(fits, b) == []
    over = [cand(i, "words " * 400) for i in range(1, 30)]
    (problem,) = memo_problems(over, b)
    assert problem.kind == ProblemKind.MEMO_OVER_BUDGET and problem.part == "memo"
    assert str(b.memo_total) in problem.message and "29 kept" in problem.message


def _text_of(tokens: int, word: str) -> str:
    from schemas.tokens import count_tokens

    words = [word]
    while count_tokens(" ".join(words)) < tokens:
        words.append(word)
    return " ".join(words)


def test_short_messages_that_fit_are_not_dropped_by_the_floor_rule():
    """Found by the memory benchmark: on an 8k window (memo 125 tokens) eight short kept
    messages all went to the record but the first, though the first and newest fit."""
    from schemas.checkpoint.budgets import CheckpointBudgets
    from schemas.checkpoint.memo import MemoCandidate, assemble_memo

    sizes = [38, 15, 11, 20, 11, 20, 11, 20]
    kept = [MemoCandidate(seq=1 + 10 * i, text=_text_of(n, f"k{i}")) for i, n in
            enumerate(sizes)]
    memo = assemble_memo(kept, CheckpointBudgets.for_window(8_000, 512))
    assert [e.seq for e in memo.entries] == [1, 31, 41, 51, 61, 71]
    assert memo.dropped_seqs == [11, 21]
