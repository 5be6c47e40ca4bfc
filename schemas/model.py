"""What the model adapter reports, as plain data both sides of an activity can read.

The adapter (`activities.model`) raises `ApplicationError`s of these types; workflows
branch on the types, never on message text.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

# The name the offline deterministic model answers with: what says, in a reply or a footer,
# that no real model wrote it.
OFFLINE_MODEL_NAME = "keel-offline-model"
# Every offline model's name starts so (the rollups' is keel-offline-rollup): none bills.
OFFLINE_PREFIX = "keel-offline"

MODEL_TIMEOUT = "ModelTimeout"
MODEL_CONNECTION = "ModelConnection"
MODEL_ERROR = "ModelError"
MODEL_MALFORMED_REPLY = "ModelMalformedReply"


def http_error_type(status: int) -> str:
    """The error type of an HTTP status the Messages API answered with."""
    return f"ModelHTTP{status}"


# How many times a turn's model call, a checkpoint round's, and a best-effort step's (the
# memory flush before a checkpoint among them) is tried (workflows.options MODEL_RETRY,
# CHECKPOINT_MODEL_RETRY, BEST_EFFORT_RETRY): an attempt before the last that fails in a
# way another may not tells the session's readers so.
MODEL_CALL_ATTEMPTS = 12
CHECKPOINT_CALL_ATTEMPTS = 8
BEST_EFFORT_ATTEMPTS = 3


# A model call's attempt from which its fallback model (`AgentSpec.fallback_model`, else the
# worker's KEEL_FALLBACK_MODEL) is asked instead: after two failures a retry could help
# (overloaded, rate-limited, a server error, no answer in time). A refusal no retry helps
# is never retried, so never asked of the fallback either.
FALLBACK_FROM_ATTEMPT = 3


def model_for_attempt(model: str, fallback: str | None, attempt: int,
                      held: bool = False) -> str:
    """The model an attempt of a call asks: the session's, then its fallback; the fallback
    from the first attempt while `held` (the worker turned to it for `model` within its
    hold: `ModelSettings.fallback_hold_s`), so a turn's every round does not wait out two
    failures of a model that is down."""
    return fallback if fallback and (held or attempt >= FALLBACK_FROM_ATTEMPT) else model


def retry_note(attempt: int, message: str, attempts: int = MODEL_CALL_ATTEMPTS,
               next_model: str | None = None) -> str | None:
    """What a reader of the session is told when attempt `attempt` of `attempts` of a
    model call failed and another follows (of `next_model` when it is another model);
    None after the last (the failure says it then)."""
    if attempt >= attempts:
        return None
    why = " ".join(message.split())
    why = why if len(why) <= 200 else why[:199] + "…"
    again = f"asking {next_model} instead" if next_model else "asking again"
    return f"the model API failed (attempt {attempt} of {attempts}: {why}); {again}"




# The API refused the prompt as longer than the model's window (a 400 whose message says
# so): the ladder's input, never a failure. Its details are (prompt tokens, maximum), the
# API's own count, when the message gives them.
PROMPT_TOO_LONG = "ModelPromptTooLong"

_TOO_LONG = re.compile(r"prompt is too long:\s*(\d+)\s*tokens\s*>\s*(\d+)\s*maximum")
_OVER_CONTEXT = re.compile(
    r"input length and `?max_tokens`? exceed context limit:\s*(\d+)\s*\+\s*(\d+)\s*>\s*(\d+)")


class TooLong(BaseModel):
    """A too-long refusal as the API worded it: its count of the prompt and the most it
    takes (the window, less the reply room asked for when it said so); None when the
    message gave no numbers. `estimate`: Keel's estimate of the refused prompt, set by
    whoever sent it, so the session corrects its estimates by the API's count."""

    prompt_tokens: int | None = None
    maximum: int | None = None
    estimate: int = 0

    def counted(self, hard_limit: int) -> int:
        """The API's count of the refused prompt: as it said, else just past the most it
        takes (it said the prompt was longer)."""
        if self.prompt_tokens is not None:
            return self.prompt_tokens
        return (self.maximum if self.maximum is not None else hard_limit) + 1


def too_long(status: int, message: str) -> TooLong | None:
    """The refusal a 400 message states, when it refuses the prompt's size; else None."""
    if status != 400:
        return None
    found = _TOO_LONG.search(message)
    if found:
        return TooLong(prompt_tokens=int(found.group(1)), maximum=int(found.group(2)))
    found = _OVER_CONTEXT.search(message)
    if found:
        prompt, reply, window = (int(g) for g in found.groups())
        return TooLong(prompt_tokens=prompt, maximum=window - reply)
    if "prompt is too long" in message:
        return TooLong()
    return None


# The API refused the request as too large for the model: a smaller request may pass (a
# prompt past the window, or a body past the API's byte limit, 413).
REFUSED_AS_TOO_LARGE = frozenset({PROMPT_TOO_LONG, http_error_type(413)})
