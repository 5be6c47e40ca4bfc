"""An upload: the parts of a file too large for one payload, staged in its session's
workspace by a workflow of its own, so the bytes never enter the session's history (the
rules: schemas.uploads).

Invariants:
- One Update per part, answered once its activity wrote it (a resent part is written once:
  its op id); a part that does not decode, or of another size or index than the rules
  allow, is refused by the validator before anything is written; a start that does not
  decode ends the run at once. No payload from any client fails a workflow task.
- The run ends when its client says it is finished (the session took the file, or the put
  was refused) or after `UPLOAD_IDLE_S` without a part, and always drops what is left of
  its parts on the way out: an upload a client abandoned costs its workspace nothing.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.files import DropUploadInput, FileActivities, StagePartInput
    from schemas.uploads import UPLOAD_WORKFLOW, UploadPart, UploadStart
    from workflows.entry import NO_PAYLOAD, arg, decoded_or_none, valid_arg
    from workflows.files import file_call, refuse_if_finished, until_done_or_idle
    from workflows.options import FILE_CALL

__all__ = ["UploadWorkflow"]


@workflow.defn(name=UPLOAD_WORKFLOW)
class UploadWorkflow:
    @workflow.init
    def __init__(self, raw: RawValue = NO_PAYLOAD) -> None:
        # Before any Update: one may come in the first activation.
        self.start = decoded_or_none(UploadStart, raw)
        self.parts = 0  # parts done: each one puts the idle timer back
        self.finished = self.start is None

    @workflow.run
    async def run(self, raw: RawValue = NO_PAYLOAD) -> int:
        start = self.start
        if start is None:
            return -1
        await until_done_or_idle(lambda: self.finished, lambda: self.parts)
        self.finished = True  # a part sent from now on is refused
        await workflow.wait_condition(workflow.all_handlers_finished)
        try:
            dropped: int = await workflow.execute_activity_method(
                FileActivities.drop_upload, DropUploadInput(
                    session_id=start.session_id, upload_id=start.upload_id), **FILE_CALL)
        except ActivityError as err:  # the session's deletion takes them in the end
            workflow.logger.warning("upload %s not dropped: %s", start.upload_id, err)
            return -1
        return dropped

    @workflow.update
    async def part(self, raw: RawValue = NO_PAYLOAD) -> None:
        part, start = arg(UploadPart, raw, NO_PAYLOAD), self.start
        assert start is not None  # the validator refused it otherwise
        await file_call(FileActivities.stage_upload_part, StagePartInput(
            session_id=start.session_id, upload_id=start.upload_id, index=part.index,
            data=part.data))
        self.parts += 1

    @part.validator
    def validate_part(self, raw: RawValue = NO_PAYLOAD) -> None:
        valid_arg(UploadPart, raw, NO_PAYLOAD, "the part")
        refuse_if_finished(self.finished, "upload")

    @workflow.signal
    def finish(self) -> None:
        self.finished = True
