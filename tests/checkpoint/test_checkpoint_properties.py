"""Properties of the checkpoint rules that must hold for any input, not just the examples.

(a) No accepted sequence of exact edits deletes a Mission entry, and the mind a checkpoint
    ends with always holds every previous Mission entry.
(b) A memo entry is always a prefix of its message in the record, within every budget,
    and the first kept message is always kept.
(c) The checklist accepts checkbox flips and reports every other single-character change.
(d) Budgets are positive and consistent for any window.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from schemas.checkpoint import CheckpointCheck, resolve_checkpoint
from schemas.checkpoint.budgets import CheckpointBudgets
from schemas.checkpoint.memo import MemoCandidate, assemble_memo, parse_checklist, render_checklist
from schemas.checkpoint.mind import MindDocument, entry_survives
from schemas.checkpoint.policy import Fit, ModelWindow, checkpoint_threshold, fit
from schemas.checkpoint.problems import MIND_STRUCTURE_KINDS
from schemas.checkpoint.scale import MIND_SECTION_BASE
from schemas.edits import EditError, apply_exact_edit
from schemas.tokens import count_tokens
from tests.checkpoint.samples import NOW

SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

WORDS = ["ship", "the", "billing", "queue", "tests", "green", "v2", "review", "oldest", "PR"]
BUDGET_CHOICES = [
    CheckpointBudgets(),
    CheckpointBudgets.for_window(20_000, 4_000),
    CheckpointBudgets.for_window(2_000, 8_192),
]

# --- (a) mission entries survive every accepted edit sequence --------------------------------

entry_text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)
status_prefix = st.sampled_from(["", "[done] ", "[active] ", "(withdrawn) "])


def build_mind(entries: list[str], lessons: int) -> str:
    mission = "".join(f"- {e}\n" for e in entries)
    text = MindDocument.template().text
    text = text.replace("\n### Workstreams", f"{mission}\n### Workstreams", 1)
    text = text.replace("- [done] ...`). It changes", "- [done] ...`). It changes", 1)
    return text.rstrip("\n") + "\n" + "- a lesson about the queue\n" * lessons


def random_edit(data: st.DataObject, text: str) -> tuple[str, str]:
    """An (old, new) pair: a random passage, or one aimed at Mission entries or headings."""
    kind = data.draw(st.sampled_from(["substring", "entry", "entry", "entry", "heading"]))
    lines = [x for x in text.split("\n") if x]
    if kind == "entry":
        entries = [x for x in lines if x.startswith("- ")] or lines
        line = data.draw(st.sampled_from(entries))
        action = data.draw(st.sampled_from(["delete", "reword", "mark", "suffix", "add"]))
        if action == "delete":
            return line + "\n", ""
        if action == "reword":
            words = line.split()
            i = data.draw(st.integers(0, len(words) - 1))
            words[i] = data.draw(st.sampled_from([*WORDS, "", "newword"]))
            return line, " ".join(words)
        if action == "mark":
            return line, line.replace("- ", f"- {data.draw(status_prefix)}", 1)
        if action == "suffix":
            return line, line + data.draw(st.sampled_from([" (status: done)", " — replaced", "."]))
        return line, line + "\n- " + data.draw(entry_text)
    if kind == "heading":
        heads = [x for x in lines if x.startswith("#")]
        line = data.draw(st.sampled_from(heads))
        return line, data.draw(st.sampled_from(["", line + "s", "#" + line, "## Notes", line]))
    start = data.draw(st.integers(0, max(0, len(text) - 1)))
    length = data.draw(st.integers(1, 40))
    new = data.draw(
        st.one_of(
            st.text(alphabet="ab -[]#\n()", max_size=20),
            st.sampled_from(WORDS),
            st.just(""),
        )
    )
    return text[start : start + length], new


@SETTINGS
@given(
    entries=st.lists(entry_text, min_size=1, max_size=5, unique=True),
    lessons=st.integers(0, 40),
    budget_index=st.integers(0, len(BUDGET_CHOICES) - 1),
    steps=st.integers(1, 8),
    data=st.data(),
)
def test_no_accepted_edit_sequence_deletes_a_mission_entry(
    entries: list[str], lessons: int, budget_index: int, steps: int, data: st.DataObject
) -> None:
    budgets = BUDGET_CHOICES[budget_index]
    previous = MindDocument(text=build_mind(entries, lessons))
    before = previous.mission_entries()
    assert len(before) == len(entries)

    text = previous.text
    for _ in range(steps):
        old, new = random_edit(data, text)
        try:
            text = apply_exact_edit(text, old, new)
        except EditError:
            continue
    mind = MindDocument(text=text)
    problems = mind.validate(previous, budgets)

    accepted = not any(p.kind in MIND_STRUCTURE_KINDS for p in problems)
    event("mind accepted" if accepted else "mind rejected")
    if accepted:
        # Accepted: every previous entry's words still stand under ### Mission.
        mission = mind.sections().get("Mission", "")
        assert len(mind.mission_entries()) >= len(before)
        for entry in before:
            assert entry_survives(entry, [mission]), (entry, mission)

    check = CheckpointCheck(problems=[p for p in problems if p.part == "mind"], now_text=NOW)
    outcome = resolve_checkpoint(
        check=check,
        mind=mind,
        previous_mind=previous,
        candidates=[],
        memo_untouched_rounds_exhausted=False,
        budgets=budgets,
        full_mind_path="/tmp/mind-full.md",
    )
    assert not outcome.failed
    event(f"previous kept: {outcome.mind_kept_previous}, cut: {outcome.mind_cut}")
    for final in (outcome.mind_record_text, outcome.mind_context_text):
        assert final is not None
        kept = MindDocument(text=final).mission_entries()
        for entry in before:
            assert entry_survives(entry, kept), (entry, final)


# --- (b) memo entries are prefixes of the record, within budget -----------------------------

message_text = st.builds(
    lambda piece, times: piece * times,
    st.text(
        alphabet=st.sampled_from([*"abc xyz.,\n\té世界🎉日本", "ä", "\u0301", "ß"]),
        max_size=120,
    ),
    st.integers(1, 30),
)


@SETTINGS
@given(
    texts=st.lists(message_text, max_size=25),
    seqs=st.lists(st.integers(1, 10_000), min_size=25, max_size=25, unique=True),
    window=st.integers(1_000, 400_000),
)
def test_memo_entries_are_record_prefixes_within_budget(
    texts: list[str], seqs: list[int], window: int
) -> None:
    budgets = CheckpointBudgets.for_window(window, 8_192)
    kept = [MemoCandidate(seq=s, text=t) for s, t in zip(seqs, texts, strict=False)]
    originals = {c.seq: c.text for c in kept}
    memo = assemble_memo(kept, budgets)

    event(f"shortened: {any(e.cut for e in memo.entries)}, dropped: {bool(memo.dropped_seqs)}")
    seqs_out = [e.seq for e in memo.entries]
    assert seqs_out == sorted(seqs_out)
    assert sorted(seqs_out + memo.dropped_seqs) == sorted(originals)
    total = 0
    for e in memo.entries:
        original = originals[e.seq]
        assert original.startswith(e.text)
        assert e.cut == (e.text != original)
        tokens = count_tokens(e.text)
        assert tokens <= budgets.memo_per_message
        total += tokens
    assert total == memo.total_tokens <= budgets.memo_total
    if kept:
        assert memo.entries and memo.entries[0].seq == min(originals)


# --- (c) the checklist accepts exactly checkbox flips ----------------------------------------

candidate_lists = st.lists(
    st.builds(
        MemoCandidate,
        seq=st.integers(1, 500),
        text=st.text(alphabet="ab x[]#-\n", min_size=0, max_size=100),
        kept_before=st.booleans(),
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda c: c.seq,
)


def box_positions(text: str) -> list[int]:
    positions, offset = [], 0
    for line in text.split("\n"):
        if line.startswith("- [") and line[3:5] in {" ]", "x]"} and line[5:7] == " #":
            positions.append(offset + 3)
        offset += len(line) + 1
    return positions


@SETTINGS
@given(candidates=candidate_lists, data=st.data())
def test_checkbox_flips_are_accepted(candidates: list[MemoCandidate], data: st.DataObject) -> None:
    original = render_checklist(candidates)
    chars = list(original)
    expected = set()
    by_position = dict(zip(box_positions(original), sorted(c.seq for c in candidates), strict=True))
    for pos, seq in by_position.items():
        box = data.draw(st.sampled_from([" ", "x", "X"]))
        chars[pos] = box
        if box != " ":
            expected.add(seq)
    result = parse_checklist(original, "".join(chars))
    assert result.problems == []
    assert result.ticked == sorted(expected)


@SETTINGS
@given(
    candidates=candidate_lists,
    op=st.sampled_from(["substitute", "insert", "delete"]),
    char=st.sampled_from(list(" xX\n#-[]a1.…")),
    data=st.data(),
)
def test_any_other_single_character_change_is_reported(
    candidates: list[MemoCandidate], op: str, char: str, data: st.DataObject
) -> None:
    original = render_checklist(candidates)
    boxes = set(box_positions(original))
    last = len(original) if op == "insert" else len(original) - 1
    positions = st.integers(0, last)
    if op == "substitute":
        positions = st.one_of(st.sampled_from(sorted(boxes)), positions)  # boxes are sparse
    pos = data.draw(positions)
    if op == "substitute":
        if original[pos] == char:
            return
        edited = original[:pos] + char + original[pos + 1 :]
        flip = pos in boxes and char in " xX"
    elif op == "insert":
        edited = original[:pos] + char + original[pos:]
        flip = False
    else:
        edited = original[:pos] + original[pos + 1 :]
        flip = False
    # Newlines at the very end carry nothing the model wrote; they are not changes.
    only_trailing_newlines = edited.rstrip("\n") == original.rstrip("\n")

    result = parse_checklist(original, edited)
    event(f"accepted: {flip or only_trailing_newlines}")
    if flip or only_trailing_newlines:
        assert result.problems == []
    else:
        assert result.problems, (op, pos, char)
        assert all(p.line is not None and p.part == "memo" for p in result.problems)


# --- (d) budgets for any window --------------------------------------------------------------

windows = st.integers(1_000, 2_000_000)
outputs = st.integers(1, 300_000)
price_steps = st.one_of(st.none(), st.integers(1_000, 2_000_000))


@settings(max_examples=300, deadline=None)
@given(window=windows, max_output=outputs, price_step=price_steps)
def test_budgets_positive_and_consistent(
    window: int, max_output: int, price_step: int | None
) -> None:
    b = CheckpointBudgets.for_window(window, max_output, price_step)
    for name, value in b.model_dump().items():
        assert value > 0, name

    threshold = checkpoint_threshold(window, max_output, price_step)
    assert b.threshold == threshold
    assert threshold <= window * 9 // 10
    if price_step is not None:
        assert threshold < price_step
    model = ModelWindow(context_window=window, max_output_tokens=max_output,
                        price_step_tokens=price_step)
    # At the threshold a request needs no room, unless a reply larger than a quarter of
    # a tiny window leaves the hard limit below the threshold.
    assert fit(min(threshold, model.hard_limit), model) is Fit.FITS
    assert fit(threshold + 1, model) is not Fit.FITS

    assert b.recent_tail < threshold and b.recent_tail <= 20_000
    for name, limit in b.section_limits().items():
        assert 50 <= limit <= MIND_SECTION_BASE[name]
    assert b.memo_share_floor <= b.memo_per_message <= 300
    assert b.memo_per_message <= b.memo_total <= 3_000
    assert b.skills_each <= b.skills_total <= 25_000
    assert b.skills_total <= max(1, min(window, price_step or window) // 10)
    # What a checkpoint carries, with a now of the minimum length (at least two characters
    # a token), fits under the threshold.
    assert b.carried_total + b.now_min_chars // 2 < threshold


@settings(max_examples=200, deadline=None)
@given(a=windows, b=windows, max_output=outputs)
def test_budgets_grow_with_the_window(a: int, b: int, max_output: int) -> None:
    small, large = sorted((a, b))
    s = CheckpointBudgets.for_window(small, max_output)
    big = CheckpointBudgets.for_window(large, max_output)
    for name in s.section_limits():
        assert s.section_limit(name) <= big.section_limit(name)
    assert s.memo_total <= big.memo_total
    assert s.memo_per_message <= big.memo_per_message
    assert s.skills_total <= big.skills_total
    assert s.threshold <= big.threshold
    assert s.recent_tail <= big.recent_tail
