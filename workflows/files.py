"""A client's file calls on a session's workspace (put, read, list): refused by the
Update's validator before anything is written, done by one file activity each.

Invariants: a path that is not a workspace path (for a write, one Keel keeps for itself
too) and a put of bytes over `FILE_CALL_MAX_BYTES` (a larger file comes in parts, staged
by an upload: schemas.uploads) are refused before the Update is accepted, as is
every call to a session that refused its start; what the activity could not do fails the
Update with its reason (`Rejection.FILE_REFUSED`), never the session.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.tools import ToolError, workspace_path
    from schemas.files import FILE_CALL_MAX_BYTES, PutFile, limit_text
    from schemas.session import Rejection
    from schemas.uploads import UPLOAD_IDLE_S
    from workflows.failures import reason, rejected
    from workflows.options import FILE_CALL

__all__ = ["file_call", "file_path_problem", "put_problem", "refuse_if_finished",
           "until_done_or_idle"]


def file_path_problem(refused: str | None, path: str, *, for_write: bool) -> None:
    """Raise the refusal of a file call on `path` (None: the session took its start)."""
    if refused:
        raise rejected(refused)
    try:
        workspace_path(path, for_write=for_write)
    except ToolError as err:
        raise ApplicationError(str(err), type=Rejection.FILE_REFUSED,
                               non_retryable=True) from None


def put_problem(refused: str | None, data: PutFile) -> None:
    """Raise the refusal of a put: its path, its size, bytes and parts both or neither."""
    file_path_problem(refused, data.path, for_write=True)
    if (data.data is None) == (data.staged is None):
        raise ApplicationError("a put carries the file's bytes or names its upload, one of "
                               "the two", type=Rejection.FILE_REFUSED, non_retryable=True)
    if data.data is not None and len(data.data) > FILE_CALL_MAX_BYTES:
        raise ApplicationError(limit_text(repr(data.path), len(data.data),
                                          FILE_CALL_MAX_BYTES) + " for a file sent in one "
                               "call (Temporal's payload limit): put it in parts "
                               "(SessionHandle.put_file does)",
                               type=Rejection.FILE_REFUSED, non_retryable=True)


async def file_call(method: Any, arg: BaseModel) -> Any:
    """One file activity; what it could not do fails the Update with its reason."""
    try:
        return await workflow.execute_activity_method(method, arg, **FILE_CALL)
    except ActivityError as err:
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.type == Rejection.FILE_TOO_LARGE:
            raise ApplicationError(cause.message, type=Rejection.FILE_TOO_LARGE,
                                   non_retryable=True) from None  # read it in parts
        raise ApplicationError(reason(err), type=Rejection.FILE_REFUSED,
                               non_retryable=True) from None


async def until_done_or_idle(done: Callable[[], bool], parts: Callable[[], int]) -> None:
    """An upload's or a download's life: until its client says it is done, or
    `UPLOAD_IDLE_S` pass without a new part."""
    while not done():
        seen = parts()
        try:
            await workflow.wait_condition(lambda: done() or parts() != seen,  # noqa: B023
                                          timeout=timedelta(seconds=UPLOAD_IDLE_S))
        except TimeoutError:
            return


def refuse_if_finished(finished: bool, what: str) -> None:
    """An upload's or a download's validator: nothing more once it is finished."""
    if finished:
        raise ApplicationError(f"this {what} is finished; start another",
                               type=Rejection.FILE_REFUSED, non_retryable=True)
