"""A file past one Temporal payload put through the client and read back: in parts, by an
upload (a download) workflow of its own, so the bytes never enter the session's history; a
put naming parts that are missing or not the file sent is refused; an upload its client
abandoned is dropped after its idle time (time-skipping server); no malformed part or
start fails a workflow task; a session that ended still has its files read. Real
Temporal, real PostgreSQL, the fake API."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import uuid

import pytest
from PIL import Image
from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.worker import Worker

from activities.files import FileActivities
from activities.workspace import open_store
from keel.client import FileRefusedError, SessionStoppedError
from schemas.config import WorkspaceStoreKind
from schemas.files import FILE_CALL_MAX_BYTES, PutFile
from schemas.uploads import (
    DOWNLOAD_WORKFLOW,
    UPLOAD_PART_BYTES,
    UPLOAD_WORKFLOW,
    DownloadPart,
    DownloadStart,
    StagedFile,
    UploadPart,
    UploadStart,
    staging_dir,
    upload_workflow_id,
)
from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings
from workflows.upload import UploadWorkflow


def noisy_png(width: int, height: int) -> bytes:
    """A screenshot-sized PNG that does not compress: about width x height x 3 bytes."""
    buf = io.BytesIO()
    Image.frombytes("RGB", (width, height), os.urandom(width * height * 3)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("store", ["local", "postgres"])
async def test_a_screenshot_past_one_payload_is_sent_and_the_history_holds_none_of_it(
        client, database_url, fake_anthropic, tmp_path, store):
    shot = noisy_png(1000, 900)
    assert len(shot) > 3 * FILE_CALL_MAX_BYTES  # 2.7 MB: eight parts, four at a time
    seen: list[bytes] = []

    def respond(body: dict) -> dict:
        first = body["messages"][-1]["content"]
        seen.extend(base64.b64decode(b["source"]["data"]) for b in first
                    if isinstance(b, dict) and b.get("type") == "image")
        return text_message("a screenshot full of noise")

    fake_anthropic.responder = respond
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url).model_copy(
        update={"workspace_store": WorkspaceStoreKind(store)})
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"upload-{uuid.uuid4().hex[:8]}")
        outcome = await session.ask("What is on it?", attachments=[("shot.png", shot)])
        assert outcome.reply_text == "a screenshot full of noise"
        # And back: the file read whole, in parts, by a download of its own.
        [put] = [f for f in await session.list_files() if f.path.endswith("shot.png")]
        back = await session.read_file(put.path)
        assert back is not None and (back.data, back.version, back.path) == (
            shot, 1, put.path)
        history = await session.handle.fetch_history()
        uploads = [w async for w in client.list_workflows(
            f"WorkflowId STARTS_WITH '{session.session_id}.'")]
        await session.put_file("notes.md", "kept")
        await session.end()
        await session.handle.result()
        # Its workspace outlives it: a service reads the files of a session that ended.
        after = await session.read_file(put.path)
        assert after is not None and after.data == shot
        small = await session.read_file("notes.md")
        assert small is not None and small.data == b"kept"
        assert await session.read_file("nothing.md") is None
        assert [f.path for f in await session.list_files()
                if not f.path.startswith(".keel/")] == [put.path, "notes.md"]
        assert [f.path for f in await session.list_files("notes")] == ["notes.md"]
        with pytest.raises(SessionStoppedError):  # before any part is sent
            await session.put_file("late.png", shot)
    assert seen == [shot]  # the model got the very bytes
    assert len(history.to_json()) < 200_000  # none of the 2.7 MB (x 4/3) in the session's
    [upload] = [w for w in uploads if w.workflow_type == UPLOAD_WORKFLOW]
    done = await client.get_workflow_handle(upload.id).result()
    assert done == 0  # finished: the put took the parts, nothing left to drop
    kept = open_store(settings, database_url=database_url)
    assert await kept.list(session.session_id, ".keel/uploads/") == []


async def test_a_put_naming_missing_or_changed_parts_is_refused(
        client, database_url, fake_anthropic, tmp_path):
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"upload-bad-{uuid.uuid4().hex[:8]}")
        upload_id = uuid.uuid4().hex
        wanted = b"a" * (UPLOAD_PART_BYTES + 10)
        staged = StagedFile(upload_id=upload_id, parts=2, size=len(wanted),
                            sha256=hashlib.sha256(wanted).hexdigest())
        with pytest.raises(FileRefusedError, match="part 1 of 2 of the upload is missing"):
            await session._put(PutFile(path="big.bin", staged=staged))
        upload = await client.start_workflow(
            UPLOAD_WORKFLOW, UploadStart(session_id=session.session_id, upload_id=upload_id),
            id=upload_workflow_id(session.session_id, upload_id),
            task_queue=settings.task_queue)
        await upload.execute_update("part", UploadPart(index=0, data=wanted[:UPLOAD_PART_BYTES]))
        await upload.execute_update("part", UploadPart(index=1, data=b"b" * 10))  # not it
        # Malformed parts from another client are refused; the upload goes on.
        for bad in ({"index": -1, "data": ""}, {"index": "first"}, "part", None):
            with pytest.raises(WorkflowUpdateFailedError):
                await upload.execute_update("part", bad)
        with pytest.raises(FileRefusedError, match="are not the file sent"):
            await session._put(PutFile(path="big.bin", staged=staged))
        shorter = staged.model_copy(update={"size": staged.size + 1})
        with pytest.raises(FileRefusedError, match=f"make {staged.size:,} bytes, not the "
                                                   f"{staged.size + 1:,}"):
            await session._put(PutFile(path="big.bin", staged=shorter))
        # Bytes and an upload both, or neither: refused by the validator.
        for neither in (PutFile(path="x.bin"), PutFile(path="x.bin", data=b"x",
                                                       staged=staged)):
            with pytest.raises(FileRefusedError, match="one of the two"):
                await session._put(neither)
        assert "big.bin" not in [f.path for f in await session.list_files()]
        await upload.signal("finish")
        assert await upload.result() == 2  # its parts dropped on the way out
        for n, bad in enumerate(({"session_id": "x"}, "start", None)):  # another client's
            odd = await client.start_workflow(UPLOAD_WORKFLOW, bad, id=f"odd-{upload_id}-{n}",
                                              task_queue=settings.task_queue)
            assert await odd.result() == -1  # ended at once, nothing written or dropped
            odd = await client.start_workflow(DOWNLOAD_WORKFLOW, bad,
                                              id=f"odd-down-{upload_id}-{n}",
                                              task_queue=settings.task_queue)
            assert await odd.result() == 0  # ended at once, nothing read
        # A read of a file that is not there, in parts: refused, saying so.
        down = await client.start_workflow(
            DOWNLOAD_WORKFLOW, DownloadStart(session_id=session.session_id, path="no.bin"),
            id=f"down-{upload_id}", task_queue=settings.task_queue)
        assert await down.execute_update("part", DownloadPart(index=0)) is None
        with pytest.raises(WorkflowUpdateFailedError, match="update failed"):
            await down.execute_update("part", {"index": -1})
        await down.signal("finish")
        await session.end()


async def test_an_upload_its_client_abandoned_is_dropped_after_its_idle_time(
        time_skipping_env, database_url, tmp_path):
    settings = make_settings(database_url, tmp_path, "http://127.0.0.1:9")
    files = FileActivities(settings)
    queue = f"uploads-{uuid.uuid4().hex[:6]}"
    async with Worker(time_skipping_env.client, task_queue=queue,
                      workflows=[UploadWorkflow],
                      activities=[files.stage_upload_part, files.drop_upload]):
        upload_id = uuid.uuid4().hex
        upload = await time_skipping_env.client.start_workflow(
            UPLOAD_WORKFLOW, UploadStart(session_id="left", upload_id=upload_id),
            id=upload_workflow_id("left", upload_id), task_queue=queue)
        await upload.execute_update("part", UploadPart(index=0, data=b"half a file"))
        assert [f.path for f in await files.store.list("left")] == [
            f"{staging_dir(upload_id)}000000"]
        assert await upload.result() == 1  # ten idle minutes, skipped
        desc = await upload.describe()
    assert desc.status == WorkflowExecutionStatus.COMPLETED
    assert await files.store.list("left") == []


async def test_a_part_the_workspace_refuses_stops_the_upload_and_leaves_no_part(
        client, database_url, fake_anthropic, tmp_path):
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url).model_copy(
        update={"max_workspace_bytes": 1_000_000})
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"upload-full-{uuid.uuid4().hex[:8]}")
        with pytest.raises(FileRefusedError, match=r"the workspace would be [\d,]+ bytes; "
                                                   r"the limit is 1,000,000 bytes"):
            await session.put_file("big.bin", os.urandom(1_500_000))
        uploads = [w async for w in client.list_workflows(
            f"WorkflowId STARTS_WITH '{session.session_id}.upload-'")]
        [done] = [await client.get_workflow_handle(w.id).result() for w in uploads]
        assert done >= 1  # its staged parts dropped on the way out
        assert [f.path for f in await session.list_files()] == []
        await session.end()
