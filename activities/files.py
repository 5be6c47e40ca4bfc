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
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.tools import ToolError, workspace_path
from activities.workspace import StoreError, WorkspaceStore, open_store
from schemas.config import KeelSettings
from schemas.files import FileData, FileEntry, FileVersion, read_problem
from schemas.session import Rejection

KEPT_RESULTS_DIR = ".keel/results"  # whole tool results, under Keel's read-only folder
KEPT_INPUTS_DIR = ".keel/inputs"  # whole background inputs over the input limits


def kept_result_path(call_id: str) -> str:
    return f"{KEPT_RESULTS_DIR}/{call_id}.txt"


class PutFileInput(BaseModel):
    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    session_id: str
    path: str
    data: bytes
    op_id: str


class ReadFileInput(BaseModel):
    session_id: str
    path: str


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
            version = await self.store.write(data.session_id, path, data.data,
                                             op_id=data.op_id)
        except (ToolError, StoreError) as err:
            raise _refused(err) from None
        return FileVersion(path=path, version=version, size=len(data.data))

    @activity.defn
    async def read_workspace_file(self, data: ReadFileInput) -> FileData | None:
        try:
            stored = await self.store.read(data.session_id, workspace_path(data.path))
        except (ToolError, StoreError) as err:
            raise _refused(err) from None
        if stored is None:
            return None
        problem = read_problem(stored.path, len(stored.data))
        if problem:
            raise _refused(ValueError(problem))
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
