"""How a step that gave up is said: one storable line of bounded length.

Invariant: every reason put in a notice, `last_error` or an event comes through `reason`,
so it is one line, at most `NOTICE_REASON_CHARS` characters (and an ellipsis), and storable
as is (`schemas.text.make_storable`); a payload problem names fields, never quotes the
payload. Pure functions of the error: no command, no clock.
"""

from __future__ import annotations

from pydantic import ValidationError
from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from schemas.session import Rejection
    from schemas.text import make_storable

__all__ = ["NOTICE_REASON_CHARS", "decode_problem", "failure_type", "lost_notice", "reason",
           "rejected"]

NOTICE_REASON_CHARS = 500  # how much of an error a notice quotes


def rejected(why: str) -> ApplicationError:
    """A caller's input refused before anything is written."""
    return ApplicationError(why, type=Rejection.MESSAGE_REJECTED, non_retryable=True)


def reason(err: BaseException) -> str:
    """An error as one storable line of bounded length, for a notice or `last_error`."""
    cause = err.cause if isinstance(err, ActivityError) and err.cause else err
    text = " ".join(str(cause).split()) or type(cause).__name__
    last = getattr(cause, "cause", None)  # a timeout's cause: the last attempt's failure
    if last is not None and str(last) and str(last) not in text:
        text += f" (last attempt: {' '.join(str(last).split())})"
    if len(text) > NOTICE_REASON_CHARS:
        text = text[:NOTICE_REASON_CHARS] + "..."
    return make_storable(text)[0]


def failure_type(err: ActivityError) -> str | None:
    """The type an activity's ApplicationError names, if it raised one."""
    cause = err.cause
    return cause.type if isinstance(cause, ApplicationError) else None


def lost_notice(lost: str, err: BaseException) -> str:
    return f"{lost} could not be recorded and was lost: {reason(err)}"


def decode_problem(err: Exception) -> str:
    """What was wrong with a signal's payload, naming fields, never quoting the payload."""
    if isinstance(err, ValidationError):
        parts = [f"{'.'.join(str(p) for p in e['loc']) or 'the payload'}: {e['msg']}"
                 for e in err.errors(include_input=False, include_url=False)[:5]]
        return "; ".join(parts)
    cause = err.__cause__ or err
    return make_storable(f"{type(cause).__name__}: {cause}"[:NOTICE_REASON_CHARS])[0]
