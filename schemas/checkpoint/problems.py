"""What a checkpoint check can find wrong: one vocabulary shared by the now, mind and memo
rules, so the repair request and the fallback table speak about the same things."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel

Part = Literal["now", "mind", "memo"]


class ProblemKind(StrEnum):
    # The now
    NOW_MISSING = "now_missing"
    NOW_MULTIPLE = "now_multiple"
    NOW_TOO_SHORT = "now_too_short"
    # The mind's structure
    HEADING_MISSING = "heading_missing"
    HEADING_RENAMED = "heading_renamed"
    HEADING_DUPLICATED = "heading_duplicated"
    HEADING_OUT_OF_ORDER = "heading_out_of_order"
    HEADING_UNEXPECTED = "heading_unexpected"
    MISSION_FEWER_ENTRIES = "mission_fewer_entries"
    MISSION_ENTRY_MISSING = "mission_entry_missing"
    # The mind's size
    SECTION_OVER_LIMIT = "section_over_limit"
    MIND_GREW_PAST_TWICE = "mind_grew_past_twice"
    # The memo
    CHECKLIST_CHANGED = "checklist_changed"
    MEMO_OVER_BUDGET = "memo_over_budget"


# A mind with one of these has lost what makes it the same document: the fallback keeps the
# previous mind rather than a cut copy of this one.
MIND_STRUCTURE_KINDS: frozenset[ProblemKind] = frozenset(
    {
        ProblemKind.HEADING_MISSING,
        ProblemKind.HEADING_RENAMED,
        ProblemKind.HEADING_DUPLICATED,
        ProblemKind.HEADING_OUT_OF_ORDER,
        ProblemKind.HEADING_UNEXPECTED,
        ProblemKind.MISSION_FEWER_ENTRIES,
        ProblemKind.MISSION_ENTRY_MISSING,
    }
)

NOW_KINDS: frozenset[ProblemKind] = frozenset(
    {ProblemKind.NOW_MISSING, ProblemKind.NOW_MULTIPLE, ProblemKind.NOW_TOO_SHORT}
)


class Problem(BaseModel):
    """One thing a checkpoint got wrong, specific enough to fix without guessing."""

    kind: ProblemKind
    part: Part
    message: str
    # Where, for logs and tests: a mind section name, a checklist line (1-based), a seq.
    section: str | None = None
    line: int | None = None
    seq: int | None = None
