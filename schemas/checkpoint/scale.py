"""How a checkpoint's base budgets scale with the model's window: one rule, used by the
budgets (what a checkpoint may carry) and by the trigger (the room a checkpoint turn needs).

Invariant: at and above FULL_BUDGET_WINDOW the base figures hold; below it they shrink in
proportion, never under their floor.
"""

from __future__ import annotations

# The window at and above which the base limits hold.
FULL_BUDGET_WINDOW = 192_000

MIND_SECTION_BASE: dict[str, int] = {
    "Where I stand": 1_000,
    "Goals": 2_000,
    "Key decisions": 1_500,
    "Lessons": 1_500,
}
# A mind section below this can hold nothing useful; small windows get at least this.
MIND_SECTION_FLOOR = 50

MEMO_PER_MESSAGE_BASE = 300
MEMO_TOTAL_BASE = 3_000
# Under this many tokens a memo entry stops saying anything: even shortening gives way to
# keeping the first and newest messages whole enough to read.
MEMO_SHARE_FLOOR = 40


def scaled(base: int, window: int, floor: int) -> int:
    if window >= FULL_BUDGET_WINDOW:
        return base
    return max(floor, base * window // FULL_BUDGET_WINDOW)


def mind_section_limits(window: int) -> dict[str, int]:
    """Each mind section's limit on an (effective) window, by heading, in document order."""
    return {name: scaled(base, window, MIND_SECTION_FLOOR)
            for name, base in MIND_SECTION_BASE.items()}


def memo_limits(window: int) -> tuple[int, int]:
    """(per message, total) of the memo on an (effective) window."""
    per_message = min(MEMO_PER_MESSAGE_BASE,
                      scaled(MEMO_PER_MESSAGE_BASE, window, MEMO_SHARE_FLOOR))
    # The total never drops below one whole entry, so the first message always fits.
    return per_message, max(per_message, scaled(MEMO_TOTAL_BASE, window, MEMO_SHARE_FLOOR))
