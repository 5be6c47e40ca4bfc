"""A session's workspace files, for `keel.handle.SessionHandle`: put, read, list.

Invariant: thin calls of the session's Updates by their names in `schemas.session`
(`PUT_FILE`, `READ_FILE`, `LIST_FILES`); a put the session would refuse for its size is
refused here before anything is sent (`schemas.files.put_problem`, the session's own rule);
a file past one payload goes in parts through an upload workflow, so its bytes never enter
the session's history (schemas.uploads); every refusal is one of Keel's exceptions
(keel._errors).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from typing import Any, TypeVar

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)

from keel._errors import (
    AttachmentRefusedError,
    FileRefusedError,
    FileTooLargeError,
    SessionStoppedError,
    ended_or_unknown,
    from_update_failure,
    refusals,
)
from schemas.attachments import sending_problem, upload_path
from schemas.files import (
    FileData,
    FileEntry,
    FileVersion,
    ListFiles,
    PutFile,
    ReadFile,
    normal_path,
    put_problem,
)
from schemas.session import Handler, SessionStatus
from schemas.uploads import (
    DOWNLOAD_WORKFLOW,
    PARTS_IN_FLIGHT,
    UPLOAD_PART_BYTES,
    UPLOAD_WORKFLOW,
    DownloadPart,
    DownloadStart,
    FilePart,
    StagedFile,
    UploadPart,
    UploadStart,
    download_workflow_id,
    upload_workflow_id,
)

__all__ = ["Attachments", "SessionFiles", "checked_attachments"]

T = TypeVar("T")

# What a message may carry: a file of the session's workspace by its path, or a file's
# name and bytes (text is put as UTF-8), put in the workspace first
# (schemas.attachments.upload_path).
Attachments = Sequence[str | tuple[str, bytes | str]]


def _given(item: object) -> str | tuple[str, bytes]:
    """One attachment as given, checked: a path, or a name and its bytes."""
    if isinstance(item, str):
        return item
    if (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
            and isinstance(item[1], bytes | str)):
        data = item[1].encode() if isinstance(item[1], str) else item[1]
        return item[0], data
    raise AttachmentRefusedError(
        "an attachment is a workspace path or a (name, bytes) pair, not "
        f"{type(item).__name__}; nothing was sent")


class SessionFiles:
    """Mixed into `SessionHandle`: the session's workspace files."""

    handle: WorkflowHandle[Any, SessionStatus]
    client: Client
    max_file_bytes: int

    async def put_file(self, path: str, data: bytes | str) -> int:
        """Write `data` (text is written as UTF-8) at `path` in the session's workspace, as
        the file tools would; returns the file's new version. `FileRefusedError` when the
        path or the size is refused (a size over the limits before anything is sent)."""
        raw = data.encode() if isinstance(data, str) else data
        problem = put_problem(path, len(raw), self.max_file_bytes)
        if problem:
            raise FileRefusedError(problem)
        if len(raw) > UPLOAD_PART_BYTES:  # in parts, outside the session's history
            return await self._put_in_parts(path, raw)
        return await self._put(PutFile(path=path, data=raw))

    async def _put(self, put: PutFile) -> int:
        async with refusals(self.handle):
            # One update id per put: the session writes once for it, however often sent.
            done: FileVersion = await self.handle.execute_update(
                Handler.PUT_FILE, put, id=f"put-{uuid.uuid4()}", result_type=FileVersion)
        return done.version

    async def _put_in_parts(self, path: str, raw: bytes) -> int:
        """A file staged by an upload workflow of its own, part by part, then taken by the
        session's put naming it (schemas.uploads); the upload is finished either way."""
        upload_id = uuid.uuid4().hex
        async with refusals(self.handle):
            found = await self.handle.describe()
        if found.status != WorkflowExecutionStatus.RUNNING:  # refused before any part goes
            raise await ended_or_unknown(self.handle) or SessionStoppedError(
                f"session {self.handle.id!r} has stopped")
        queue = found.task_queue
        upload = await self.client.start_workflow(
            UPLOAD_WORKFLOW, UploadStart(session_id=self.handle.id, upload_id=upload_id),
            id=upload_workflow_id(self.handle.id, upload_id), task_queue=queue)
        starts = range(0, len(raw), UPLOAD_PART_BYTES)
        gate = asyncio.Semaphore(PARTS_IN_FLIGHT)

        async def send(index: int, at: int) -> None:
            async with gate:
                try:
                    await upload.execute_update("part", UploadPart(
                        index=index, data=raw[at:at + UPLOAD_PART_BYTES]))
                except WorkflowUpdateFailedError as err:
                    raise from_update_failure(err) from err

        try:
            await _all_or_first_error(send(i, at) for i, at in enumerate(starts))
            return await self._put(PutFile(path=path, staged=StagedFile(
                upload_id=upload_id, parts=len(starts), size=len(raw),
                sha256=hashlib.sha256(raw).hexdigest())))
        finally:
            with contextlib.suppress(Exception):  # it drops its parts after a while anyway
                await upload.signal("finish")

    async def read_file(self, path: str) -> FileData | None:
        """The file's bytes and the version they are (`.data`, `.version`); None when there
        is no file at `path`. A file past one payload is read in parts, outside the
        session's history (schemas.uploads)."""
        try:
            async with refusals(self.handle):
                # temporalio types result_type as `type`; its pydantic converter decodes a
                # union.
                found: FileData | None = await self.handle.execute_update(
                    Handler.READ_FILE, ReadFile(path=path, at_most=UPLOAD_PART_BYTES),
                    result_type=FileData | None)  # type: ignore[arg-type]
        except (FileTooLargeError, SessionStoppedError):  # its workspace outlives it
            return await self._read_in_parts(path)
        return found

    async def _read_in_parts(self, path: str) -> FileData | None:
        """A file read part by part by a download workflow of its own (None: there is no
        such file); read again from the start when the agent wrote it meanwhile (two parts
        of two versions, or a part gone)."""
        async with self._reading(path) as download:
            gate = asyncio.Semaphore(PARTS_IN_FLIGHT)

            async def fetch(index: int) -> FilePart | None:
                async with gate:
                    return await _part(download, index)

            for _ in range(READ_TRIES):
                if (first := await _part(download, 0)) is None:
                    return None
                rest = await _all_or_first_error(
                    fetch(i) for i in range(1, -(-first.size // UPLOAD_PART_BYTES)))
                parts = [first, *(p for p in rest if p is not None)]
                data = b"".join(p.data for p in parts)
                if len(data) == first.size and all(p.version == first.version
                                                   for p in parts):
                    return FileData(path=normal_path(path), data=data,
                                    version=first.version)
                # written meanwhile: from the start
            raise FileRefusedError(f"{path!r} changed while it was read, {READ_TRIES} times "
                                   "in a row; read it again")

    async def list_files(self, prefix: str = "") -> list[FileEntry]:
        """Every file of the session's workspace (path, size, version), by path; a session
        that ended too (its workspace outlives it)."""
        try:
            async with refusals(self.handle):
                found: list[FileEntry] = await self.handle.execute_update(
                    Handler.LIST_FILES, ListFiles(prefix=prefix),
                    result_type=list[FileEntry])
        except SessionStoppedError:
            async with self._reading("") as download:
                try:
                    found = await download.execute_update(
                        "list", ListFiles(prefix=prefix), result_type=list[FileEntry])
                except WorkflowUpdateFailedError as err:
                    raise from_update_failure(err) from err
        return found

    @contextlib.asynccontextmanager
    async def _reading(self, path: str) -> AsyncIterator[WorkflowHandle[Any, Any]]:
        """A download workflow of this session's (reading `path`), finished when done."""
        async with refusals(self.handle):
            queue = (await self.handle.describe()).task_queue
        download = await self.client.start_workflow(
            DOWNLOAD_WORKFLOW, DownloadStart(session_id=self.handle.id, path=path),
            id=download_workflow_id(self.handle.id, uuid.uuid4().hex), task_queue=queue)
        try:
            yield download
        finally:
            with contextlib.suppress(Exception):  # it ends after a while anyway
                await download.signal("finish")

    async def attachment_paths(self, attachments: Attachments) -> list[str]:
        """The workspace path of each attachment, a file given by its bytes put there first
        (`put_file`). Refused before anything is put or sent (`checked_attachments`)."""
        found = checked_attachments(attachments)
        for path, data in found:
            if data is not None:
                await self.put_file(path, data)
        return [path for path, _ in found]


def checked_attachments(attachments: Attachments) -> list[tuple[str, bytes | None]]:
    """Each attachment's workspace path, with its bytes when it is given by them (None: a
    workspace file). Refused as the session would refuse it: too many, one twice, bytes of
    no kind the model takes or past its limits (`AttachmentRefusedError`)."""
    given = [_given(item) for item in attachments]
    paths = [item if isinstance(item, str) else upload_path(*item) for item in given]
    problem = sending_problem(paths, [(path, item[1]) for path, item
                                      in zip(paths, given, strict=True)
                                      if not isinstance(item, str)])
    if problem:
        raise AttachmentRefusedError(f"{problem}; nothing was sent")
    return [(path, None if isinstance(item, str) else item[1])
            for path, item in zip(paths, given, strict=True)]


READ_TRIES = 3  # reads of a file in parts that the agent's writes may restart


async def _part(download: WorkflowHandle[Any, Any], index: int) -> FilePart | None:
    try:
        found: FilePart | None = await download.execute_update(
            "part", DownloadPart(index=index),
            result_type=FilePart | None)  # type: ignore[arg-type]
    except WorkflowUpdateFailedError as err:
        raise from_update_failure(err) from err
    return found


async def _all_or_first_error(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Every call's result in order; at the first failure the others are cancelled (no part
    goes on being sent after a refusal) and that failure is raised as itself."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_awaited(c)) for c in calls]
    except BaseExceptionGroup as errors:
        raise errors.exceptions[0] from None
    return [t.result() for t in tasks]


async def _awaited(call: Awaitable[T]) -> T:
    return await call
