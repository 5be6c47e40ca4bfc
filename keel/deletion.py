"""Deleting a session: `delete_session(keel, session_id)`, or `keel delete SESSION`.

Invariants:
- A running session is deleted only when the caller says to stop it (`force`): it is
  terminated first, so no turn of it starts again. Without `force` the refusal says how
  to end it; nothing is deleted.
- What the session owns goes, in this order: its entries in its memory scope's daily
  notes (through the vault's one writer; the vault not answering, nothing more is
  deleted), its record in the database (rows, checkpoints, workspace and the rest:
  activities.session_delete, one transaction), its entries again (a transcript drained
  meanwhile), its local workspace folder, its wakeups' schedules and the runs they started,
  and every run of its workflow from Temporal (histories: the user's words are in them
  too), with those of its files' uploads and downloads (their bytes are in them; one
  running is stopped before the record goes). Cut short anywhere, deleting again finishes
  it; a session deleted whole is "unknown", and its id may name a new session, whose
  daily-note entries then never meet the old one's.
- A step that was running when `force` stopped the session may still write; its record
  refuses a row once the session's row is gone, and a second sweep a moment later takes
  what else a quick step wrote. A long one (a model call learns the session is gone at its
  next heartbeat, ~20 s; a tool at its end) can still write a workspace file after that:
  deleting again a minute later takes it.
- What is not the session's own stays and is named: its sub-agents' sessions (sessions
  of their own, deleted first only when asked: `sub_agents`, and then theirs too) and the
  scope's cards and rollups (the scope's knowledge, which other
  sessions read and edit). The vault's git history keeps what it committed.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import (
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from keel._errors import BranchRefusedError, DeleteRefusedError
from keel._queues import polled_recently
from schemas.config import vault_queue
from schemas.session import (
    SESSION_WORKFLOW,
    SessionPhase,
    id_clause,
    session_id_problem,
)

if TYPE_CHECKING:
    from activities.session_delete import RowsDeleted
    from keel.client import KeelClient
    from schemas.bundle_memory import BundleMemoryDone

__all__ = ["SessionDeleted", "delete_session", "ended_before", "on_the_vault"]

T = TypeVar("T")

MEMORY_WAIT_S = 120.0  # the vault's worker forgetting the session's entries
ENDING_WAIT_S = 10.0  # an ended session finishing its handlers, before it is refused
SWEEP_AFTER_S = 2.0  # after stopping a session, before looking again for what it wrote
VAULT_GRACE_S = 3.0  # a vault worker started a moment ago: its first poll on the way
TERMINATED = "deleted on request"


class SessionDeleted(BaseModel):
    """What a deletion took out, and what it left because it is not the session's own."""

    session_id: str
    terminated: bool  # it was running, and `force` stopped it
    runs: int  # workflow runs deleted from Temporal
    rows: int  # conversation rows (rewound ones too)
    checkpoints: int
    files: int  # workspace files (each with its versions)
    schedules: int  # wakeup schedules
    memory_scope: str | None = None  # its long memory: its cards and rollups stay
    entries: int = 0  # its daily-note entries taken out of that memory
    unreadable: list[str] = []  # daily files not UTF-8 throughout: left as they were
    sub_agents: list[str] = []  # its sub-agents' sessions, which stay
    sub_agents_deleted: list[SessionDeleted] = []  # with `sub_agents`: theirs, first

    def summary(self) -> list[str]:
        """What went, then what stayed and why, a line each (the command line and the web
        UI say the same)."""
        stopped = " (it was running: stopped first)" if self.terminated else ""
        lines = [f"deleted session {self.session_id}{stopped}: {self.rows} row(s), "
                 f"{self.checkpoints} checkpoint(s), {self.files} workspace file(s), "
                 f"{self.schedules} wakeup schedule(s), {self.runs} workflow run(s)"]
        if self.memory_scope:
            lines.append(f"long memory (scope {self.memory_scope}): {self.entries} "
                         "daily-note entries taken out; its cards and rollups stay (and "
                         "the vault's git history)")
        if self.unreadable:
            lines.append("left as they are (not UTF-8 throughout): " + ", ".join(
                self.unreadable))
        if self.sub_agents:
            lines.append("kept: its sub-agents' sessions " + ", ".join(self.sub_agents)
                         + " (delete each by its id, or with --with-sub-agents)")
        return [line for child in self.sub_agents_deleted for line in child.summary()] \
            + lines


async def delete_session(keel: KeelClient, session_id: str, *, force: bool = False,
                         database_url: str | None = None, memory_scope: str | None = None,
                         sub_agents: bool = False, forget: bool = True) -> SessionDeleted:
    """Delete `session_id` and all it owns (see the module's invariants);
    `DeleteRefusedError` says why not. `memory_scope`: forget the session's daily-note
    entries there even when its record is gone already (a deletion whose vault did not
    answer the first time). `sub_agents`: its sub-agents' sessions first, and theirs (one
    refused, the session itself is untouched). `forget=False`: its long memory is left to
    the caller, who erases its whole scope next (keel.scope_erase)."""
    if problem := session_id_problem(session_id):  # names no session (`_shared`: every
        raise DeleteRefusedError(problem)          # session's workspace) is never deleted
    url = database_url or keel.settings.database_url
    if not url:
        raise DeleteRefusedError("deleting a session deletes its record: set DATABASE_URL")
    children = [await delete_session(keel, child, force=force, database_url=url,
                                     sub_agents=True)
                for child in await _children(keel, session_id)] if sub_agents else []
    done = await _delete_one(keel, session_id, force, str(url), memory_scope,
                             {c.session_id for c in children}, forget)
    done.sub_agents_deleted = children
    return done


async def _children(keel: KeelClient, session_id: str) -> list[str]:
    """The sessions it delegated to: their ids start `<session>.` (schemas.initiative.
    child_session_id; a child may be started by an activity, so it is no child workflow in
    Temporal's eyes) and their memo names it as parent (a session merely named so is not)."""
    found: set[str] = set()
    async for wf in keel.client.list_workflows(
            f"{id_clause('WorkflowId', session_id + '.', starts_with=True)} AND "
            f"WorkflowType = '{SESSION_WORKFLOW}'"):
        if wf.id.startswith(f"{session_id}.") and wf.id not in found and (
                (await wf.memo()).get("keel") or {}).get("parent") == session_id:
            found.add(wf.id)
    return sorted(found)


async def _delete_one(keel: KeelClient, session_id: str, force: bool, url: str,
                      memory_scope: str | None, gone: set[str],
                      forget: bool = True) -> SessionDeleted:
    """`delete_session` of the session itself (`gone`: its sub-agents deleted first)."""
    from activities.session_delete import memory_scope_of

    runs, newest = await _runs(keel, session_id)
    scope = (await memory_scope_of(url, session_id) or memory_scope) if forget else None
    if scope:  # before anything is stopped or deleted
        await vault_served(keel, scope)
    terminated = await _stop(keel, session_id, newest, force)
    transfers = await _delete_transfers(keel, session_id)  # before its record: no part after
    removed, forgotten = await _delete_record(keel, url, session_id, terminated, scope)
    if not runs and not removed.found and forgotten is None:
        raise DeleteRefusedError(f"no session {session_id} in this deployment")
    files = await _delete_local_folder(keel, session_id) + removed.counts.get("files", 0)
    schedules = await _delete_wakeups(keel, session_id)
    # Visibility may still list a child deleted a moment ago.
    sub_agents = [c for c in await _children(keel, session_id) if c not in gone]
    for run_id in runs:
        await delete_run(keel, session_id, run_id)
    return SessionDeleted(
        session_id=session_id, terminated=terminated, runs=len(runs) + transfers,
        rows=removed.counts.get("rows", 0), checkpoints=removed.counts.get("checkpoints", 0),
        files=files, schedules=schedules, memory_scope=removed.memory_scope or memory_scope,
        entries=forgotten.entries if forgotten else 0,
        unreadable=forgotten.unreadable if forgotten else [], sub_agents=sub_agents)


async def _delete_record(keel: KeelClient, url: str, session_id: str, terminated: bool,
                         scope: str | None) -> tuple[RowsDeleted, BundleMemoryDone | None]:
    """The session's record (activities.session_delete) and its entries in long memory.
    The vault is asked first (it not answering, nothing is deleted) and again after the
    rows are gone: a transcript drained meanwhile read its rows before they went."""
    from activities.session_delete import delete_rows
    from schemas.bundle_memory import BundleMemoryDone

    first = await _forget(keel, session_id, scope) if scope else None
    removed = await delete_rows(url, session_id)
    if terminated:  # what a step that was running wrote meanwhile
        await asyncio.sleep(SWEEP_AFTER_S)
        removed = removed.add(await delete_rows(url, session_id))
    if not scope or first is None:
        return removed, None
    try:
        again = await _forget(keel, session_id, scope)
    except DeleteRefusedError as err:
        raise DeleteRefusedError(
            f"session {session_id}'s record is deleted, but its long memory was not asked "
            f"again ({err}); delete it with --memory-scope {scope} once the vault "
            "answers") from None
    return removed, BundleMemoryDone(entries=first.entries + again.entries,
                                     unreadable=sorted({*first.unreadable, *again.unreadable}))


async def vault_served(keel: KeelClient, scope: str) -> None:
    """DeleteRefusedError when no vault worker serves the vault's queue: the session's
    entries could not leave its long memory, so nothing is stopped or deleted."""
    queue = vault_queue(keel.task_queue)
    if not await polled_recently(keel.client, queue, activities=True,
                                 grace_s=VAULT_GRACE_S):
        raise DeleteRefusedError(
            f"long memory (scope {scope}) has no vault worker: none polled {queue} lately "
            "(keel dev runs one; on a cluster, keel worker --vault). Nothing was deleted")


async def on_the_vault(keel: KeelClient, workflow: str, arg: BaseModel, result_type: type[T],
                       *, scope: str, kind: str, not_done: str, again: str) -> T:
    """One of the vault's small workflows (its one writer, on its queue) started and
    waited for, at most MEMORY_WAIT_S; DeleteRefusedError saying why not: `not_done` and
    the failure, or that no vault worker answered; `again` says what to do then."""
    handle = await keel.client.start_workflow(
        workflow, arg, id=f"keel-{kind}-{scope}-{uuid.uuid4().hex[:8]}",
        task_queue=keel.task_queue, result_type=result_type)
    try:
        done: T = await asyncio.wait_for(handle.result(), MEMORY_WAIT_S)
    except TimeoutError:
        raise DeleteRefusedError(
            f"long memory (scope {scope}) did not answer in {MEMORY_WAIT_S:.0f} s: is a "
            f"vault worker running? {again.capitalize()} once it answers") from None
    except WorkflowFailureError as err:
        said = err.cause.message if isinstance(err.cause, ApplicationError) else str(err)
        raise DeleteRefusedError(f"{not_done}: {said}; {again}") from None
    return done


async def _forget(keel: KeelClient, session_id: str, scope: str) -> BundleMemoryDone:
    """The session's daily-note entries out of the scope's vault, through the vault's one
    writer (activities.bundle_memory); DeleteRefusedError when it does not answer."""
    from keel.branching import memory_call
    from schemas.bundle_memory import BundleMemoryRequest

    request = BundleMemoryRequest(request_id=f"forget-{uuid.uuid4().hex}",
                                  direction="forget", session_id=session_id, scope=scope)
    try:
        return await asyncio.wait_for(memory_call(keel, request), MEMORY_WAIT_S)
    except TimeoutError:
        raise DeleteRefusedError(
            f"long memory (scope {scope}) did not answer in {MEMORY_WAIT_S:.0f} s: is a "
            "vault worker running? Nothing more was deleted") from None
    except BranchRefusedError as err:
        raise DeleteRefusedError(f"long memory (scope {scope}) refused: {err}") from None


async def ended_before(keel: KeelClient, when: datetime) -> list[str]:
    """The sessions whose newest run closed before `when` (ended, stopped, terminated or
    failed), oldest first: what a retention policy deletes. A run that continued as new
    is not an end (its session goes on), and a session running now is never listed."""
    if when.tzinfo is None:
        raise DeleteRefusedError("give the time with its offset (2026-11-01T00:00:00+00:00)")
    found: dict[str, datetime] = {}
    async for wf in keel.client.list_workflows(
            f"WorkflowType = '{SESSION_WORKFLOW}' AND ExecutionStatus != 'Running' AND "
            f"ExecutionStatus != 'ContinuedAsNew' AND CloseTime < "
            f"'{when.astimezone(UTC).isoformat()}'"):
        found.setdefault(wf.id, wf.close_time or wf.start_time)
    return sorted(found, key=lambda sid: found[sid])


async def _runs(keel: KeelClient, session_id: str
                ) -> tuple[list[str], WorkflowExecutionDescription | None]:
    """Every run of the session's workflow Temporal keeps, and the newest as it stands now
    (visibility may lag: a session just ended can still be listed as running; every
    earlier run continued as new, closed)."""
    runs = [wf.run_id for wf in await keel.runs(session_id)
            if wf.workflow_type == SESSION_WORKFLOW]
    try:
        newest = await keel.client.get_workflow_handle(session_id).describe()
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        return [], None  # nothing of it is left in Temporal (a listing may still show it)
    if newest.workflow_type != SESSION_WORKFLOW:
        return runs, None
    if newest.run_id not in runs:
        runs.append(newest.run_id)
    return runs, newest


def _running(run: WorkflowExecutionDescription | None) -> bool:
    return run is not None and run.status in (None, WorkflowExecutionStatus.RUNNING)


async def _stop(keel: KeelClient, session_id: str,
                newest: WorkflowExecutionDescription | None, force: bool) -> bool:
    """Terminate the session's running run when `force`; refuse when not. A session that
    was ended (its phase says so) is given ENDING_WAIT_S to finish its handlers first.
    True when a run was stopped here."""
    if newest is None or not _running(newest):
        return False
    handle = keel.client.get_workflow_handle(session_id, run_id=newest.run_id)
    if ((await newest.memo()).get("keel") or {}).get("phase") == SessionPhase.ENDED:
        deadline = time.monotonic() + ENDING_WAIT_S
        while _running(newest) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            newest = await handle.describe()
        if not _running(newest):
            return False
    if not force:
        raise DeleteRefusedError(
            f"session {session_id} is running: end it first (keel end {session_id}) and "
            "delete it once it has ended, or delete it with --force to stop it now")
    try:
        await handle.terminate(reason=TERMINATED)
    except RPCError as err:  # it ended meanwhile
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
    return True


async def _delete_local_folder(keel: KeelClient, session_id: str) -> int:
    """The session's folder under this machine's data folder, where a local workspace
    store keeps it (whichever store is configured now: it may have been local before):
    how many files it held."""
    from activities.workspace import LocalStore

    settings = keel.settings
    store = LocalStore.of(settings)
    folder = store.folder(session_id)
    if folder.parent != settings.workspaces_dir or not folder.is_dir():
        return 0
    files = len(await store.list(session_id))
    await asyncio.to_thread(shutil.rmtree, folder)
    return files


async def _delete_wakeups(keel: KeelClient, session_id: str) -> int:
    """The session's wakeup schedules (`keel-wakeup-<session>-w<n>`: a wakeup's id has no
    dash, so another session's never matches) and the runs they started."""
    from activities.wakeups import WAKEUP_FIRE_WORKFLOW, wakeup_schedule_id

    prefix = wakeup_schedule_id(session_id, "")
    mine = re.compile(re.escape(prefix) + r"w\d+")
    deleted = 0
    async for listed in await keel.client.list_schedules(
            id_clause("ScheduleId", prefix, starts_with=True)):
        if mine.fullmatch(listed.id):
            try:
                await keel.client.get_schedule_handle(listed.id).delete()
                deleted += 1
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise
    async for wf in keel.client.list_workflows(
            f"{id_clause('WorkflowId', prefix, starts_with=True)} AND "
            f"WorkflowType = '{WAKEUP_FIRE_WORKFLOW}'"):
        if mine.match(wf.id):
            await delete_run(keel, wf.id, wf.run_id)
    return deleted


async def _delete_transfers(keel: KeelClient, session_id: str) -> int:
    """The runs of the uploads and downloads of its files (`<session>.upload-<id>`,
    `.download-<id>`: schemas.uploads), whose histories hold the files' bytes; one still
    running is terminated first, so it stages no part after the workspace is gone."""
    from schemas.uploads import DOWNLOAD_WORKFLOW, UPLOAD_WORKFLOW

    mine = re.compile(re.escape(session_id) + r"\.(upload|download)-[0-9a-f]{32}")
    deleted = 0
    async for wf in keel.client.list_workflows(
            f"{id_clause('WorkflowId', session_id + '.', starts_with=True)} AND "
            f"(WorkflowType = '{UPLOAD_WORKFLOW}' OR WorkflowType = '{DOWNLOAD_WORKFLOW}')"):
        if mine.fullmatch(wf.id):
            await delete_run(keel, wf.id, wf.run_id)
            deleted += 1
    return deleted


async def delete_run(keel: KeelClient, workflow_id: str, run_id: str) -> None:
    """One run out of Temporal: its history and its visibility record. A running one is
    terminated by the server first (only a wakeup's fire can be, here)."""
    try:
        await keel.client.workflow_service.delete_workflow_execution(
            DeleteWorkflowExecutionRequest(
                namespace=keel.client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id)))
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
