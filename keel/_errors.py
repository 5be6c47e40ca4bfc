"""Every refusal a `keel.client` caller sees is decided here, and only here, by type:
a session's own refusals by their `ApplicationError.type` (`schemas.session.Rejection`),
Temporal's answers by exception class and `RPCStatusCode`; never by message text.

What Temporal itself answers (checked against the dev server in tests/test_client.py):

    start an id that exists (running or ended)  WorkflowAlreadyStartedError  SessionExistsError
    start-with-message on an ended session      WorkflowAlreadyStartedError  SessionStoppedError
    update / signal a session that has ended    RPCError NOT_FOUND           SessionStoppedError
    update / signal / query an unknown id       RPCError NOT_FOUND           SessionNotFoundError

Both NOT_FOUND cases carry the same status, so one `describe` tells them apart. Every
message is one readable line: the refusal's own message, without an "ErrorType: " prefix.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from schemas.branch import BRANCH_REFUSED
from schemas.session import Rejection, SessionStatus


class KeelError(Exception):
    """A refusal or misconfiguration worth one readable line to whoever called Keel."""


class NoTemporalAddressError(KeelError):
    """`KeelClient.connect` got no address and the settings have none."""


class SessionExistsError(KeelError):
    """A session with this id exists already; Keel never starts a second one."""


class SessionNotFoundError(KeelError):
    """No session has this id."""


class MessageRejectedError(KeelError):
    """The session refused the message (empty, too long, stopped); nothing was recorded."""


class SessionStoppedError(MessageRejectedError):
    """The session has ended (for example grown too long); start a new one."""


class RecordFailedError(MessageRejectedError):
    """The record could not take the message in time; nothing was kept, send it again."""


class NotPendingError(KeelError):
    """An approval decision for a call that is not pending (or was decided already)."""


class AgentSpecRefusedError(KeelError):
    """The agent spec was refused (invalid schema, duplicate tool, unknown profile)."""


class StartRefusedError(KeelError, ValueError):
    """A session refused before anything starts: its id cannot name a session
    (schemas.session.session_id_problem), its config holds a value it cannot work with
    (`config_bounds_problem`), or its window leaves Keel's own prompt no room or a full
    reply leaves a request nothing (schemas.input_size)."""


class FileRefusedError(KeelError):
    """A file call the workspace refused: a path outside it or in Keel's own folder, a size
    over a limit (the store's sentence), or a store that did not answer."""


class FileTooLargeError(FileRefusedError):
    """A read past one payload, refused as such by the session; `SessionHandle.read_file`
    then reads the file in parts (schemas.uploads), so a caller never sees it."""


class BranchRefusedError(KeelError):
    """A fork, rewind, export or import refused: a point outside the record or inside a
    tool round, a session not idle, a bundle of a version this Keel does not read."""


class DeleteRefusedError(KeelError):
    """A deletion refused: the session is running (and was not to be stopped), no session
    has the id, or there is no database to delete its record from."""


class NoSuchInputError(KeelError):
    """`wait_reply` for a seq the session never gave out."""


class SessionBusyError(MessageRejectedError):
    """A message sent with policy 'reject' while a turn runs: nothing was recorded."""


class AttachmentRefusedError(MessageRejectedError):
    """A file sent with the message is missing, of no kind the model takes, or past its
    limits: nothing was recorded."""


class NoBudgetRequestError(KeelError):
    """A budget answer when no budget request (or not that one) is pending."""


class DataDirError(KeelError, ValueError):
    """A data folder the embedded stack cannot use (keel.devstack): nothing was started."""


REJECTIONS: dict[str, type[KeelError]] = {
    Rejection.MESSAGE_REJECTED: MessageRejectedError,
    Rejection.SESSION_STOPPED: SessionStoppedError,
    Rejection.RECORD_FAILED: RecordFailedError,
    Rejection.NO_SUCH_INPUT: NoSuchInputError,
    Rejection.NOT_PENDING: NotPendingError,
    Rejection.AGENT_SPEC_REFUSED: AgentSpecRefusedError,
    Rejection.FILE_REFUSED: FileRefusedError,
    Rejection.FILE_TOO_LARGE: FileTooLargeError,
    BRANCH_REFUSED: BranchRefusedError,
    Rejection.BUSY: SessionBusyError,
    Rejection.NO_BUDGET_REQUEST: NoBudgetRequestError,
    Rejection.ATTACHMENT_REFUSED: AttachmentRefusedError,
}


def one_line(text: str) -> str:
    return " ".join(text.split())


def from_update_failure(err: WorkflowUpdateFailedError) -> KeelError:
    """The session's validator or handler refused: its `Rejection` type names the error."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        kind = REJECTIONS.get(cause.type or "", MessageRejectedError)
        return kind(one_line(cause.message))
    return MessageRejectedError(one_line(str(cause or err)))


def already_started(session_id: str) -> SessionExistsError:
    return SessionExistsError(f"session {session_id!r} exists already")


async def ended_or_unknown(handle: WorkflowHandle[Any, SessionStatus]) -> KeelError | None:
    """Temporal answered NOT_FOUND: an ended session or an unknown id. None: it is running
    after all (started meanwhile), so the original error stands."""
    try:
        described = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return SessionNotFoundError(
                f"session {handle.id!r} not found: is the session id right?")
        raise
    if described.status == WorkflowExecutionStatus.RUNNING:
        return None
    return SessionStoppedError(f"session {handle.id!r} has stopped: "
                               f"{await _why_ended(handle, described.status)}")


async def start_with_message_refused(handle: WorkflowHandle[Any, SessionStatus]
                                     ) -> KeelError:
    """Update-with-start reuses a running session, so only an ended one refuses the start
    (the id is never reused): that session has stopped."""
    return await ended_or_unknown(handle) or already_started(handle.id)


async def _why_ended(handle: WorkflowHandle[Any, SessionStatus],
                     status: WorkflowExecutionStatus | None) -> str:
    if status == WorkflowExecutionStatus.COMPLETED:
        with suppress(WorkflowFailureError, RPCError):
            final = await handle.result(follow_runs=False)
            if final.stopped_reason:
                return one_line(final.stopped_reason)
    return status.name.lower().replace("_", " ") if status else "ended"


@asynccontextmanager
async def refusals(handle: WorkflowHandle[Any, SessionStatus]) -> AsyncIterator[None]:
    """Turn what a call on the session's handle raises into Keel's exceptions; anything
    else (Temporal unreachable, a timeout) passes through unchanged."""
    try:
        yield
    except WorkflowUpdateFailedError as err:
        raise from_update_failure(err) from err
    except RPCError as err:
        mapped = await ended_or_unknown(handle) if err.status == RPCStatusCode.NOT_FOUND else None
        if mapped is None:
            raise
        raise mapped from err


def raise_if_cancelled(err: BaseException) -> None:
    """A waiting update call ends in `WorkflowUpdateRPCTimeoutOrCancelledError` both when
    the server cuts it off (ask again) and when the caller's task is cancelled (a timeout
    around it, Ctrl-C): the latter is raised as the cancel it is, so the wait stops."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError() from err
