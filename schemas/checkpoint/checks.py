"""The checks of a checkpoint and the fallbacks applied after the one repair.

`validate_checkpoint` lists every problem of an attempt (now, mind, memo), so the repair
request can name them all at once; `resolve_checkpoint` applies the fallback table to the
final attempt, keeping more rather than less: a failed now fails the checkpoint and
changes nothing, every other problem falls back to a rule that keeps the user's words.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from schemas.checkpoint.budgets import CheckpointBudgets
from schemas.checkpoint.memo import (
    MemoAssembly,
    MemoCandidate,
    assemble_memo,
    memo_problems,
    parse_checklist,
)
from schemas.checkpoint.mind import MindDocument, cut_sections
from schemas.checkpoint.now import extract_now, now_problems
from schemas.checkpoint.problems import (
    MIND_STRUCTURE_KINDS,
    NOW_KINDS,
    Part,
    Problem,
    ProblemKind,
)


class CheckpointCheck(BaseModel):
    """Every problem of one checkpoint attempt, and what could be read from it."""

    problems: list[Problem] = Field(default_factory=list)
    now_text: str | None = None
    ticked: list[int] = Field(default_factory=list)
    checklist_untouched: bool = False
    checklist_changed: bool = False  # changed beyond its checkboxes

    @property
    def ok(self) -> bool:
        return not self.problems

    def problems_in(self, part: Part) -> list[Problem]:
        return [p for p in self.problems if p.part == part]


def validate_checkpoint(
    *,
    final_text: str,
    mind: MindDocument,
    previous_mind: MindDocument,
    checklist_original: str,
    checklist_edited: str,
    candidates: list[MemoCandidate],
    budgets: CheckpointBudgets,
) -> CheckpointCheck:
    parsed = parse_checklist(checklist_original, checklist_edited)
    offered = {c.seq for c in candidates}
    ticked = [s for s in parsed.ticked if s in offered]
    kept = [c for c in candidates if c.seq in set(ticked)]
    problems = [
        *now_problems(final_text, budgets),
        *mind.validate(previous_mind, budgets),
        *parsed.problems,
        *memo_problems(kept, budgets),
    ]
    return CheckpointCheck(
        problems=problems,
        now_text=extract_now(final_text),
        ticked=ticked,
        checklist_untouched=parsed.untouched,
        checklist_changed=parsed.changed_beyond_boxes,
    )


# --- the fallbacks -------------------------------------------------------------------------


class CheckpointOutcome(BaseModel):
    """What a checkpoint attempt comes to once the fallbacks have been applied."""

    failed: bool = False
    reason: str | None = None
    now_text: str | None = None
    mind_record_text: str | None = None  # the whole mind, stored in the record
    mind_context_text: str | None = None  # what the context shows (cut when over its limits)
    mind_kept_previous: bool = False
    mind_cut: bool = False
    memo: MemoAssembly = Field(default_factory=MemoAssembly)
    # Every message kept by decision (ticked, or kept by a fallback), including any the
    # budget left in the record: they stay ticked candidates at the next checkpoint.
    kept_seqs: list[int] = Field(default_factory=list)
    fallbacks: list[str] = Field(default_factory=list)


def resolve_checkpoint(
    *,
    check: CheckpointCheck,
    mind: MindDocument,
    previous_mind: MindDocument,
    candidates: list[MemoCandidate],
    memo_untouched_rounds_exhausted: bool,
    budgets: CheckpointBudgets,
    full_mind_path: str,
) -> CheckpointOutcome:
    """Apply the fallback table to the check after the repair, keeping more rather than less.

    `check` must be the check of the final attempt. The mind is re-checked here from `mind`
    and `previous_mind`, so the outcome never depends on a stale check of another text.
    `memo_untouched_rounds_exhausted`: the turn ran out of tool rounds; it counts only when
    the checklist was indeed left as written.
    """
    now_issues = [p for p in check.problems if p.kind in NOW_KINDS]
    if check.now_text is None or now_issues:
        detail = "; ".join(p.message for p in now_issues) or "no checkpoint block"
        return CheckpointOutcome(
            failed=True,
            reason=f"no usable now: {detail}",
            fallbacks=["now: no usable now, the checkpoint fails and the context stays as it was"],
        )

    chosen, kept_previous, fallbacks = _mind_to_keep(mind, previous_mind, budgets)
    tokens, limits = chosen.section_tokens(), budgets.section_limits()
    over = {n: t for n, t in tokens.items() if t > limits[n]}
    context_text = chosen.text
    if over:
        context_text = cut_sections(chosen, budgets, full_mind_path)
        listed = ", ".join(f"{n} {t}/{limits[n]}" for n, t in over.items())
        fallbacks.append(
            f"mind: over its limits ({listed}); whole mind kept in the record, the context "
            f"shows it cut and points to {full_mind_path}"
        )
    kept, memo_fallbacks = _memo_to_keep(check, candidates, memo_untouched_rounds_exhausted)
    fallbacks += memo_fallbacks
    memo = assemble_memo(kept, budgets)
    fallbacks += [f"memo: {note}" for note in memo.fallbacks]

    return CheckpointOutcome(
        now_text=check.now_text,
        mind_record_text=chosen.text,
        mind_context_text=context_text,
        mind_kept_previous=kept_previous,
        mind_cut=bool(over),
        memo=memo,
        kept_seqs=sorted({c.seq for c in kept}),
        fallbacks=fallbacks,
    )


def _mind_to_keep(mind: MindDocument, previous_mind: MindDocument,
                  budgets: CheckpointBudgets) -> tuple[MindDocument, bool, list[str]]:
    """The new mind, or the previous one when the new lost its structure or grew past
    twice its limits; whether the previous was kept; the fallback said."""
    mind_issues = mind.validate(previous_mind, budgets)
    lost = [p for p in mind_issues if p.kind in MIND_STRUCTURE_KINDS]
    grew = [p for p in mind_issues if p.kind == ProblemKind.MIND_GREW_PAST_TWICE]
    if not (lost or grew):
        return mind, False, []
    why = "lost its structure" if lost else "grew past twice its limits"
    return previous_mind, True, [
        f"mind: {why} ({len(lost) + len(grew)} problem(s)); previous mind kept"]


def _memo_to_keep(check: CheckpointCheck, candidates: list[MemoCandidate],
                  rounds_exhausted: bool) -> tuple[list[MemoCandidate], list[str]]:
    """The ticked candidates; every candidate when the checklist was changed beyond its
    checkboxes, or left as written because the tool rounds ran out."""
    if check.checklist_changed:
        return list(candidates), ["memo: changed beyond its checkboxes; every candidate kept"]
    if rounds_exhausted and check.checklist_untouched:
        return list(candidates), [
            "memo: left as written when tool rounds ran out; every candidate kept"]
    ticked = set(check.ticked)
    return [c for c in candidates if c.seq in ticked], []
