"""A download: a file too large for one payload read from a session's workspace part by
part, by a workflow of its own, so the bytes never enter the session's history (the rules:
schemas.uploads).

Invariants:
- One Update per part, answered with the part and the file's version and size as its
  activity read them (None: there is no such file); the client starts again when two parts
  disagree on the version.
- It reads the store, not the session: a session that ended still has its workspace
  (until it is deleted), and a client reads and lists its files this way (`list`).
- It writes nothing: the run ends when its client says it is done, or after
  `UPLOAD_IDLE_S` without a part. A part or a start that does not decode is refused (the
  start: the run ends at once); no payload from any client fails a workflow task.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from activities.files import FileActivities, ListFilesInput, ReadPartInput
    from schemas.files import FileEntry, ListFiles
    from schemas.uploads import (
        DOWNLOAD_WORKFLOW,
        DownloadPart,
        DownloadStart,
        FilePart,
    )
    from workflows.entry import NO_PAYLOAD, arg, decoded_or_none, valid_arg
    from workflows.files import file_call, refuse_if_finished, until_done_or_idle

__all__ = ["DownloadWorkflow"]


@workflow.defn(name=DOWNLOAD_WORKFLOW)
class DownloadWorkflow:
    @workflow.init
    def __init__(self, raw: RawValue = NO_PAYLOAD) -> None:
        # Before any Update: one may come in the first activation.
        self.start = decoded_or_none(DownloadStart, raw)
        self.parts = 0  # parts done: each one puts the idle timer back
        self.finished = self.start is None

    @workflow.run
    async def run(self, raw: RawValue = NO_PAYLOAD) -> int:
        await until_done_or_idle(lambda: self.finished, lambda: self.parts)
        self.finished = True
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.parts

    @workflow.update
    async def part(self, raw: RawValue = NO_PAYLOAD) -> FilePart | None:
        part, start = arg(DownloadPart, raw, NO_PAYLOAD), self.start
        assert start is not None  # the validator refused it otherwise
        found: FilePart | None = await file_call(FileActivities.read_workspace_part, ReadPartInput(
            session_id=start.session_id, path=start.path, index=part.index))
        self.parts += 1
        return found

    @part.validator
    def validate_part(self, raw: RawValue = NO_PAYLOAD) -> None:
        valid_arg(DownloadPart, raw, NO_PAYLOAD, "the part")
        refuse_if_finished(self.finished, "download")

    @workflow.update(name="list")
    async def list_files(self, raw: RawValue = NO_PAYLOAD) -> list[FileEntry]:
        asked, start = arg(ListFiles, raw, NO_PAYLOAD), self.start
        assert start is not None  # the validator refused it otherwise
        found: list[FileEntry] = await file_call(
            FileActivities.list_workspace_files,
            ListFilesInput(session_id=start.session_id, prefix=asked.prefix))
        self.parts += 1
        return found

    @list_files.validator
    def validate_list(self, raw: RawValue = NO_PAYLOAD) -> None:
        valid_arg(ListFiles, raw, NO_PAYLOAD, "the list request")
        refuse_if_finished(self.finished, "download")

    @workflow.signal
    def finish(self) -> None:
        self.finished = True
