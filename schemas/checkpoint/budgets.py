"""How much each part of a checkpoint may hold, and how text is cut to fit.

Every budget of the checkpoint specification lives here, once; when a checkpoint starts is
`schemas.checkpoint.policy`. The base limits hold on a window of 192,000 tokens or more
and shrink in proportion below it, with floors so that each limit stays usable on a tiny
window; `for_window` keeps them consistent for any window (the sum of what a checkpoint
carries always fits under the threshold).
"""

from __future__ import annotations

from pydantic import BaseModel

from schemas.checkpoint.policy import ModelWindow, checkpoint_threshold, effective_window
from schemas.checkpoint.scale import (  # noqa: F401  (re-exported: the budgets' base figures)
    FULL_BUDGET_WINDOW,
    MEMO_PER_MESSAGE_BASE,
    MEMO_SHARE_FLOOR,
    MEMO_TOTAL_BASE,
    MIND_SECTION_BASE,
    MIND_SECTION_FLOOR,
    memo_limits,
    mind_section_limits,
)
from schemas.tokens import count_tokens, truncate_to_tokens

RECENT_TAIL_BASE = 20_000
SKILLS_EACH_BASE = 5_000
SKILLS_TOTAL_BASE = 25_000
SKILLS_MAX_COUNT = 20
FILES_MODIFIED = 10
FILES_READ = 5
NOW_MIN_CHARS = 200
MAX_TOOL_ROUNDS = 5


class CheckpointBudgets(BaseModel):
    """How much each part of a checkpoint may hold, in tokens unless named otherwise.

    The defaults are those of a 200,000-token window with 8,192 output tokens; build one
    for a real model with `for_window`.
    """

    context_window: int = 200_000
    threshold: int = 171_308  # checkpoint_threshold(200_000, 8_192)
    where_i_stand: int = 1_000
    goals: int = 2_000
    key_decisions: int = 1_500
    lessons: int = 1_500
    memo_per_message: int = MEMO_PER_MESSAGE_BASE
    memo_total: int = MEMO_TOTAL_BASE
    memo_share_floor: int = MEMO_SHARE_FLOOR
    recent_tail: int = RECENT_TAIL_BASE
    skills_each: int = SKILLS_EACH_BASE
    skills_total: int = 20_000
    skills_max_count: int = SKILLS_MAX_COUNT
    files_modified: int = FILES_MODIFIED
    files_read: int = FILES_READ
    now_min_chars: int = NOW_MIN_CHARS
    max_tool_rounds: int = MAX_TOOL_ROUNDS

    @classmethod
    def for_window(
        cls,
        context_window: int,
        max_output_tokens: int,
        price_step_tokens: int | None = None,
    ) -> CheckpointBudgets:
        window = effective_window(context_window, price_step_tokens)
        threshold = checkpoint_threshold(context_window, max_output_tokens, price_step_tokens)
        per_message, memo_total = memo_limits(window)
        mind = mind_section_limits(window)
        skills_total = max(1, min(SKILLS_TOTAL_BASE, window // 10))
        return cls(
            context_window=context_window,
            threshold=threshold,
            where_i_stand=mind["Where I stand"],
            goals=mind["Goals"],
            key_decisions=mind["Key decisions"],
            lessons=mind["Lessons"],
            memo_per_message=per_message,
            memo_total=memo_total,
            recent_tail=max(1, min(RECENT_TAIL_BASE, threshold // 4)),
            skills_each=min(SKILLS_EACH_BASE, skills_total),
            skills_total=skills_total,
        )

    @classmethod
    def for_model(cls, window: ModelWindow) -> CheckpointBudgets:
        return cls.for_window(window.context_window, window.max_output_tokens,
                              window.price_step_tokens)

    def section_limits(self) -> dict[str, int]:
        """Each budgeted mind section's limit, by its heading text, in document order."""
        return {
            "Where I stand": self.where_i_stand,
            "Goals": self.goals,
            "Key decisions": self.key_decisions,
            "Lessons": self.lessons,
        }

    def section_limit(self, name: str) -> int:
        """A mind section's limit by heading text ("Key decisions") or field name."""
        for heading, limit in self.section_limits().items():
            if name.strip().lower() in {heading.lower(), heading.lower().replace(" ", "_")}:
                return limit
        raise KeyError(f"no budgeted mind section named {name!r}")

    @property
    def mind_total_limit(self) -> int:
        return sum(self.section_limits().values())

    @property
    def carried_total(self) -> int:
        """The most a checkpoint carries besides the now: mind, memo, skills, recent tail."""
        return self.mind_total_limit + self.memo_total + self.skills_total + self.recent_tail


def cut_to_tokens(text: str, limit: int) -> str:
    """The longest prefix of `text`, character for character, that counts at most `limit`.

    `truncate_to_tokens` decodes a token prefix, which can end in half a multi-byte
    character (decoded as U+FFFD) and so is not always a prefix of `text`; and a re-encoded
    prefix can count differently. Every cut in a checkpoint goes through here, so a cut
    text is always a byte-for-byte prefix of its original and always within its limit.
    """
    if limit <= 0 or not text:
        return ""
    if count_tokens(text) <= limit:
        return text
    k = limit
    while k > 0:
        cut = truncate_to_tokens(text, k)
        while cut and not text.startswith(cut):
            cut = cut[:-1]
        if count_tokens(cut) <= limit:
            return cut
        k -= 1
    return ""
