"""A session's workspace files from outside the model: the client's file Updates (put,
read, list) and the whole text of a tool result too long for the record, all against the
same workspace store the file tools use (`activities.workspace`).

Invariants:
- The path rules are the file tools' (`activities.tools.workspace_path`): a client may no
  more write Keel's own `.keel/` folder than the agent may; the workflow's validators apply
  them before anything is sent here, and these activities apply them again.
- Every write carries an op id (the update's id, the tool call's id), so a retried
  activity or a resent update writes once and answers the version that write made.
- What the store refuses (a path, a size over its limits) is a non-retryable
  `ApplicationError` of type `FILE_REFUSED` with the store's own sentence.
- A file put in parts (schemas.uploads) is staged by its upload's workflow
  (`stage_upload_part`, `drop_upload`) and taken by the put that names it: its parts read
  in order and checked against the count, size and digest the client sent, the file
  written once, the parts removed.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.tools import ToolError, workspace_path
from activities.workspace import StoredFile, StoreError, WorkspaceStore, open_store
from schemas.config import KeelSettings
from schemas.files import FileData, FileEntry, FileVersion, read_problem
from schemas.session import Rejection
from schemas.uploads import UPLOAD_PART_BYTES, FilePart, StagedFile, part_path, staging_dir

KEPT_RESULTS_DIR = ".keel/results"  # whole tool results, under Keel's read-only folder
KEPT_INPUTS_DIR = ".keel/inputs"  # whole background inputs over the input limits


def kept_result_path(call_id: str) -> str:
    return f"{KEPT_RESULTS_DIR}/{call_id}.txt"


class PutFileInput(BaseModel):
    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    session_id: str
    path: str
    data: bytes = b""
    op_id: str
    staged: StagedFile | None = None  # put in parts: its bytes are those parts


class StagePartInput(BaseModel):
    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    session_id: str
    upload_id: str
    index: int
    data: bytes


class DropUploadInput(BaseModel):
    session_id: str
    upload_id: str


class ReadPartInput(BaseModel):
    session_id: str
    path: str
    index: int


class ReadFileInput(BaseModel):
    session_id: str
    path: str
    at_most: int | None = None


class ListFilesInput(BaseModel):
    session_id: str
    prefix: str = ""


class KeepResultInput(BaseModel):
    session_id: str
    call_id: str
    text: str


def _refused(err: Exception) -> ApplicationError:
    return ApplicationError(str(err), type=Rejection.FILE_REFUSED, non_retryable=True)


class FileActivities:
    def __init__(self, settings: KeelSettings) -> None:
        self.settings = settings
        self._store: WorkspaceStore | None = None

    @property
    def store(self) -> WorkspaceStore:
        if self._store is None:
            self._store = open_store(self.settings)
        return self._store

    @activity.defn
    async def put_workspace_file(self, data: PutFileInput) -> FileVersion:
        try:
            path = workspace_path(data.path, for_write=True)
            if (applied := await self.store.applied(data.session_id, data.op_id)) is not None:
                return FileVersion(path=path, version=applied, size=data.staged.size
                                   if data.staged else len(data.data))  # a retry
            raw = data.data if data.staged is None else await self._staged(
                data.session_id, data.staged)
            version = await self.store.write(data.session_id, path, raw, op_id=data.op_id)
        except (ToolError, StoreError) as err:
            raise _refused(err) from None
        if data.staged is not None:
            await self.store.remove(data.session_id, staging_dir(data.staged.upload_id))
        return FileVersion(path=path, version=version, size=len(raw))

    async def _staged(self, session_id: str, staged: StagedFile) -> bytes:
        """The bytes of a file put in parts, checked against what the client sent."""
        parts = []
        for index in range(staged.parts):
            part = await self.store.read(session_id, part_path(staged.upload_id, index))
            if part is None:
                raise _refused(ValueError(
                    f"part {index + 1} of {staged.parts} of the upload is missing (it was "
                    "dropped after 10 minutes without a part, or never sent); put the file "
                    "again"))
            parts.append(part.data)
        raw = b"".join(parts)
        if len(raw) != staged.size:
            why = f"make {len(raw):,} bytes, not the {staged.size:,} sent"
        elif hashlib.sha256(raw).hexdigest() != staged.sha256:
            why = "are not the file sent (another SHA-256)"
        else:
            return raw
        raise _refused(ValueError(f"the upload's parts {why}; put the file again"))

    @activity.defn
    async def stage_upload_part(self, data: StagePartInput) -> None:
        """One part of a file put in parts, under the session's `.keel/uploads/<id>/`."""
        try:
            await self.store.write(data.session_id, part_path(data.upload_id, data.index),
                                   data.data, op_id=f"upload-{data.upload_id}-{data.index}")
        except (StoreError, ValueError) as err:
            raise _refused(err) from None

    async def _read(self, session_id: str, path: str) -> StoredFile | None:
        """A file of the session's workspace by a client's path (the file tools' rules)."""
        try:
            return await self.store.read(session_id, workspace_path(path))
        except (ToolError, StoreError) as err:
            raise _refused(err) from None

    @activity.defn
    async def read_workspace_part(self, data: ReadPartInput) -> FilePart | None:
        """Part `index` of a file read in parts, with the file's version and size; None when
        there is no file at its path."""
        if (stored := await self._read(data.session_id, data.path)) is None:
            return None
        at = data.index * UPLOAD_PART_BYTES
        return FilePart(data=stored.data[at:at + UPLOAD_PART_BYTES], version=stored.version,
                        size=len(stored.data))

    @activity.defn
    async def drop_upload(self, data: DropUploadInput) -> int:
        """An upload's parts removed (none left once its put took them): how many."""
        try:
            return await self.store.remove(data.session_id, staging_dir(data.upload_id))
        except (StoreError, ValueError) as err:
            raise _refused(err) from None

    @activity.defn
    async def read_workspace_file(self, data: ReadFileInput) -> FileData | None:
        if (stored := await self._read(data.session_id, data.path)) is None:
            return None
        problem = read_problem(stored.path, len(stored.data), data.at_most)
        if problem:  # the client reads it in parts (schemas.uploads)
            raise ApplicationError(problem, type=Rejection.FILE_TOO_LARGE, non_retryable=True)
        return FileData(path=stored.path, data=stored.data, version=stored.version)

    @activity.defn
    async def list_workspace_files(self, data: ListFilesInput) -> list[FileEntry]:
        try:
            found = await self.store.list(data.session_id, data.prefix)
        except StoreError as err:
            raise _refused(err) from None
        return [FileEntry(path=f.path, size=f.size, version=f.version) for f in found]

    @activity.defn
    async def keep_tool_result(self, data: KeepResultInput) -> str:
        """The whole text of a result the record keeps cut, at `.keel/results/<call id>.txt`
        (read-only to the agent's write tools, readable with read_file); written once per
        call id. Returns the path."""
        path = kept_result_path(workspace_path(data.call_id.replace("/", "_")))
        try:
            await self.store.write(data.session_id, path, data.text.encode(errors="replace"),
                                   op_id=f"result-{data.call_id}")
        except StoreError as err:
            raise _refused(err) from None
        return path
