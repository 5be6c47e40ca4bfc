"""The now: the working state, rewritten at every checkpoint.

The model returns it as exactly one `<checkpoint>...</checkpoint>` block in the final text
of the checkpoint turn. One block, so there is never a question of which one counts.
"""

from __future__ import annotations

import re

from schemas.checkpoint.budgets import CheckpointBudgets
from schemas.checkpoint.problems import Problem, ProblemKind

OPEN_TAG = "<checkpoint>"
CLOSE_TAG = "</checkpoint>"

_OPEN_RE = re.compile(r"<checkpoint>", re.IGNORECASE)
_CLOSE_RE = re.compile(r"</checkpoint>", re.IGNORECASE)
_BLOCK_RE = re.compile(r"<checkpoint>(.*?)</checkpoint>", re.IGNORECASE | re.DOTALL)

NOW_GUIDE = """\
The now is your working state, written fresh; whatever it does not say is gone from the
context (the record still has it). Write it for yourself, to continue without asking:
- Current step: what you are doing right now, and the workstream it belongs to.
- Progress: what is done, what is in progress, and what is blocked or still open.
- Waiting on: background commands, Watches, Tasks, delegated runs, tool calls awaiting a
  person's approval, and questions to the user, each with its id.
- Next steps: tied to the user's latest explicit request; quote the user's words.
- Pitfalls: mistakes, false assumptions and dead ends so far, with the exact error text.
- Exact references: the paths, ids, commands, links and values needed to continue."""


def _blocks(text: str) -> list[str]:
    return [m.group(1).strip() for m in _BLOCK_RE.finditer(text)]


def extract_now(text: str) -> str | None:
    """The now, when the text holds exactly one well-formed checkpoint block."""
    blocks = _blocks(text)
    opens, closes = len(_OPEN_RE.findall(text)), len(_CLOSE_RE.findall(text))
    if len(blocks) != 1 or opens != 1 or closes != 1:
        return None
    return blocks[0]


def now_problems(text: str, budgets: CheckpointBudgets) -> list[Problem]:
    opens, closes = len(_OPEN_RE.findall(text)), len(_CLOSE_RE.findall(text))
    blocks = _blocks(text)
    if not blocks:
        detail = (
            f"'{OPEN_TAG}' is opened but never closed with '{CLOSE_TAG}'"
            if opens
            else f"'{CLOSE_TAG}' appears without '{OPEN_TAG}'"
            if closes
            else "there is none"
        )
        return [
            _now(
                ProblemKind.NOW_MISSING,
                f"the final reply has no {OPEN_TAG}...{CLOSE_TAG} block ({detail}); end the "
                "reply with the now in exactly one such block.",
            )
        ]
    if len(blocks) > 1 or opens > 1 or closes > 1:
        return [
            _now(
                ProblemKind.NOW_MULTIPLE,
                f"the final reply has {max(len(blocks), opens, closes)} checkpoint tags or "
                f"blocks; write exactly one {OPEN_TAG}...{CLOSE_TAG} block, and do not "
                "mention the tag anywhere else.",
            )
        ]
    length = len(blocks[0])
    if length < budgets.now_min_chars:
        return [
            _now(
                ProblemKind.NOW_TOO_SHORT,
                f"the now has {length} characters; it needs at least {budgets.now_min_chars}. "
                "Cover the current step, progress, what you wait on, next steps, pitfalls "
                "and exact references.",
            )
        ]
    return []


def _now(kind: ProblemKind, message: str) -> Problem:
    return Problem(kind=kind, part="now", message=message)
