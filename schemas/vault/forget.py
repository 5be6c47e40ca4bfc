"""Forgetting one card: a person has long memory drop what it knows of one contact,
project, decision or note, where erasing the scope drops everything and deleting a session
drops only its words. No I/O.

Invariants:
- The card's file goes, with its index rows (its words are no longer found, recalled or
  read back with memory_get); the scope's other cards, and the links to it they hold,
  stay (the doctor's link scan reports those links as broken).
- It is not written again out of material of the day it was forgotten or before: the
  nightly rollup of that day's transcript and a checkpoint's memory flush of messages of
  that day skip facts for it (`refused_by_forget`), naming why. The agent's own
  `write_card` (a live decision, the person may have just said it again) and material of
  later days may write it anew.
- What still holds its words is said, never touched (`CardForgotten`): the daily
  transcripts, summaries and other cards that name it, CORE.md when it does, and the
  vault's git history, which keeps every earlier version until the scope is erased.
- Forgetting a card that is not there finds nothing and says so; its tombstone is written
  all the same (a card forgotten twice is forgotten).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from schemas.vault.scope import unknown_scope_text

__all__ = ["FORGET_CARD_WORKFLOW", "CardForgotten", "ForgetCardInput", "forgotten_text",
           "refused_by_forget"]

FORGET_CARD_WORKFLOW = "ForgetMemoryCard"


class ForgetCardInput(BaseModel):
    """The vault activity's work: forget the card titled `card` (or at that vault path) in
    `scope` (a checked scope id)."""

    scope: str
    card: str


class CardForgotten(BaseModel):
    scope: str
    title: str  # as asked, or the card's own when it was found
    path: str | None = None  # the card's file, None when there was none
    forgotten_on: str = ""  # the vault's local day
    documents: int = 0  # index rows deleted
    daily_mentions: int = 0  # transcript entries that still name it
    summary_mentions: int = 0  # summaries that still name it
    card_mentions: int = 0  # other cards that still name it (a link, a fact)
    in_core: bool = False  # CORE.md names it
    # False: the deployment knows no such scope (no vault folder, PostgreSQL names it
    # nowhere) and nothing was done: a tombstone there would make a mistyped scope one.
    scope_known: bool = True
    scopes: list[str] = Field(default_factory=list)  # the scopes there are, when not known


def refused_by_forget(op_id: str, material_day: str, forgotten_on: str | None) -> bool:
    """Whether a fact for a forgotten card is refused: from a rollup's or a flush's
    material of the day it was forgotten or before (days as YYYY-MM-DD); never the
    agent's own write_card (op ids `tool:...`)."""
    return (forgotten_on is not None and not op_id.startswith("tool:")
            and material_day <= forgotten_on)


def forgotten_text(done: CardForgotten) -> list[str]:
    """What a person is told: what went, and what still holds the card's words."""
    if not done.scope_known:
        return [f"{unknown_scope_text(done.scope, done.scopes)}; nothing was forgotten"]
    if done.path is None:
        lines = [f"no card {done.title!r} in memory scope {done.scope!r}; it will not be "
                 "written again from material of today or before"]
    else:
        lines = [f"forgot {done.path} in memory scope {done.scope!r} ({done.documents} "
                 f"index row(s)); the nightly rollup and memory flushes will not write it "
                 f"again from material of {done.forgotten_on} or before"]
    held = [f"{n} {what}" for n, what in ((done.daily_mentions, "transcript entries"),
                                          (done.summary_mentions, "summaries"),
                                          (done.card_mentions, "other cards")) if n]
    if done.in_core:
        held.append("CORE.md")
    if held:
        lines.append(f"still naming {done.title!r}: {', '.join(held)} (delete their "
                     "sessions, edit those cards and CORE.md, or erase the scope)")
    lines.append("the vault's git history keeps its earlier versions until the scope is "
                 "erased")
    return lines
