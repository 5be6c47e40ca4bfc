"""How large one input may be in a session's context: one rule for a user's message and for a
background input (a Watch, a Task, an agent run, a callback).

Invariants (pure, deterministic: the workflow applies them):
- An input within the limits has at most `max_chars` characters and at most half the
  window's hard limit in tokens (`schemas.tokens.count_tokens`), so it leaves room for the
  rest of the context and the reply, and a checkpoint can always make it fit.
- A user's message over them is refused: its sender is told (`over_limits`' words).
- A background input over them has nobody to tell, and losing it would lose what the
  sender said: it is recorded cut to `kept_prefix` (within both limits, with room for the
  line saying where the rest is) and kept whole in the session's workspace.
"""

from __future__ import annotations

from pydantic import BaseModel

from schemas.tokens import count_tokens, truncate_to_tokens

__all__ = ["CUT_LINE_CHARS", "CUT_LINE_ROOM", "CUT_REASON_CHARS", "CUT_REASON_TOKENS",
           "InputLimits", "cut_line", "input_limits", "kept_prefix",
           "over_limits"]

# What is kept free under the limits for the line a cut input ends with (its counts, and
# where the whole is or why it could not be kept, that reason cut to CUT_REASON_CHARS).
CUT_LINE_ROOM = 100  # tokens
CUT_LINE_CHARS = 400
CUT_REASON_CHARS = 200
CUT_REASON_TOKENS = 60


class InputLimits(BaseModel):
    chars: int
    tokens: int


def input_limits(max_chars: int, hard_limit: int) -> InputLimits:
    """The limits for a session whose window's hard limit is `hard_limit` tokens."""
    return InputLimits(chars=max_chars, tokens=max(hard_limit // 2, 1))


def over_limits(text: str, limits: InputLimits) -> str | None:
    """What is too much about `text` ("N characters; the limit is M" or the tokens'), or
    None when it is within both limits."""
    if len(text) > limits.chars:
        return f"{len(text)} characters; the limit is {limits.chars}"
    tokens = count_tokens(text)
    if tokens > limits.tokens:
        return f"{tokens} tokens; on this model one may have at most {limits.tokens}"
    return None


def kept_prefix(text: str, limits: InputLimits) -> str:
    """The longest prefix of `text` a cut input keeps: within both limits, with room for
    its cut line."""
    head = text[:max(limits.chars - CUT_LINE_CHARS, 0)]
    return truncate_to_tokens(head, max(limits.tokens - CUT_LINE_ROOM, 0))


def cut_line(kept: int, whole: int, where: str) -> str:
    """The line a cut input ends with: how much of it is here and where the rest is."""
    short = truncate_to_tokens(where[:CUT_REASON_CHARS - 1], CUT_REASON_TOKENS)
    if short != where:
        where = short + "…"
    return f"\n[Keel: input cut at {kept} of {whole} characters; {where}]"
