"""What a message sent while a turn runs does: the policy and its choice. Pure.

Invariants:
- The policy of a send wins over the spec's, and the spec's over the default, `enqueue`
  (the message waits for the running turn to end and starts the next one).
- `reject` refuses the message before anything is written, with a clear reason; `interrupt`
  records it, stops the running model call at once (what streamed so far is kept in the
  record, marked `INTERRUPTED_MARK`), lets a tool call already started finish and be
  recorded, gives the calls not started a "not run" result, and ends the turn: the message
  starts the next one.
- A session is busy while a turn runs (model calls, tools, checkpoints, a pause on a
  person). An idle session takes every message the ordinary way, whatever the policy.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["INTERRUPTED_MARK", "NOT_RUN_TEXT", "BusyAction", "InterruptPolicy", "busy_action",
           "choose_policy", "interrupted_text", "rejected_text"]

# The line an interrupted reply ends with in the record (the model reads it next turn).
INTERRUPTED_MARK = "[Keel: interrupted here; a new message came before this reply ended]"
NOT_RUN_TEXT = ("Not run: the turn was interrupted by a new message before this call "
                "started.")


class InterruptPolicy(StrEnum):
    ENQUEUE = "enqueue"
    INTERRUPT = "interrupt"
    REJECT = "reject"


class BusyAction(StrEnum):
    """What the session does with a message now."""

    RECORD = "record"  # the ordinary way (idle, or enqueue)
    INTERRUPT = "interrupt"  # record it, then stop the running turn
    REFUSE = "refuse"


def choose_policy(send: InterruptPolicy | None,
                  spec: InterruptPolicy | None) -> InterruptPolicy:
    return send or spec or InterruptPolicy.ENQUEUE


def busy_action(policy: InterruptPolicy, *, busy: bool) -> BusyAction:
    if not busy or policy is InterruptPolicy.ENQUEUE:
        return BusyAction.RECORD
    return BusyAction.INTERRUPT if policy is InterruptPolicy.INTERRUPT else BusyAction.REFUSE


def rejected_text(turn: int) -> str:
    return (f"the session is busy with turn {turn} and this message's policy is 'reject': "
            "nothing was recorded. Send it again when the turn has ended, or with "
            "policy 'enqueue' (wait for the turn) or 'interrupt' (stop it).")


def interrupted_text(partial: str) -> str:
    """An interrupted reply's text in the record: what streamed, then the mark."""
    partial = partial.rstrip()
    return f"{partial}\n\n{INTERRUPTED_MARK}" if partial else INTERRUPTED_MARK
