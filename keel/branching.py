"""The client's side of branching a session: fork, rewind, export and import.

A fork and a rewind go through Temporal (workflows.branch): the fork's workflow id is named
by its request id, so a retried fork (the same request id) waits for the first one's
result instead of making a second session. Export and import read and write the record's
database directly (activities.bundle, imported only when called, so `keel.client` still
loads no database code) and speak to the session's workflow for its state; an import
starts the session's workflow with the state its bundle carries.

With memory, the vault (one writer, its own queue) is reached through the `BundleMemory`
workflow (workflows.bundle_memory): before an export, it stages the session's cards and
daily entries for the export to read; after an import's transaction, it writes what the
import staged, and when a card is in the way the import is undone before its session
starts, the refusal naming the files.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from temporalio.client import WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError

from keel._errors import (
    AgentSpecRefusedError,
    BranchRefusedError,
    StartRefusedError,
    one_line,
    refusals,
)
from schemas.branch import FORK_WORKFLOW, BranchError, ForkCopy, ForkDone, live_wakeups
from schemas.bundle_memory import (
    BUNDLE_MEMORY_WORKFLOW,
    BundleMemoryDone,
    BundleMemoryRequest,
    conflict_text,
)
from schemas.session import (
    SESSION_WORKFLOW,
    Handler,
    SessionInput,
    SessionState,
    session_id_problem,
)

if TYPE_CHECKING:
    from activities.workspace import LocalStore
    from keel.client import KeelClient
    from keel.handle import SessionHandle
    from schemas.agent import AgentSpec
    from schemas.branch import ImportDone

__all__ = ["export_session", "fork_session", "import_session", "memory_call",
           "seal_public_key", "session_state"]


async def session_state(session: SessionHandle) -> SessionState:
    """The session's small state (its config, its checkpoint, its counters)."""
    async with refusals(session.handle):
        state: SessionState = await session.handle.query(Handler.STATE,
                                                         result_type=SessionState)
    return state


def _refusal(err: BaseException) -> BranchRefusedError:
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = cause.__cause__
    return BranchRefusedError(one_line(cause.message if cause else str(err)))


async def fork_session(keel: KeelClient, session_id: str, *, at_seq: int | None = None,
                       checkpoint: int | None = None, new_id: str | None = None,
                       request_id: str | None = None) -> ForkDone:
    """A new session with the context `session_id` had at `at_seq` (or right after its
    `checkpoint`-th checkpoint; neither: now). `BranchRefusedError` says why not."""
    if at_seq is not None and checkpoint is not None:
        raise BranchRefusedError("give a seq or a checkpoint, not both")
    new_id = new_id or f"{session_id}-fork-{uuid.uuid4().hex[:8]}"
    if bad_id := session_id_problem(new_id):  # the fork would refuse it, after a round trip
        raise BranchRefusedError(f"{bad_id}; pick another id")
    request_id = request_id or f"fork-{uuid.uuid4().hex}"
    state = await session_state(keel.session(session_id))
    data = ForkCopy(request_id=request_id, origin=session_id, new_session=new_id,
                    at_seq=at_seq, checkpoint=checkpoint,
                    origin_state=state.model_copy(update={"recent_outcomes": []}))
    workflow_id = f"keel-fork-{request_id}"
    try:
        handle = await keel.client.start_workflow(
            FORK_WORKFLOW, data, id=workflow_id, task_queue=keel.task_queue,
            result_type=ForkDone, id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE)
    except WorkflowAlreadyStartedError:  # a retry: the first one's result
        handle = keel.client.get_workflow_handle(workflow_id, result_type=ForkDone)
    try:
        done: ForkDone = await handle.result()
    except WorkflowFailureError as err:
        raise _refusal(err) from None
    return done


async def memory_call(keel: KeelClient, data: BundleMemoryRequest) -> BundleMemoryDone:
    """The vault's side of a session's memory (a bundle's, a deletion's: the BundleMemory
    workflow), once per request (a retry finds the same)."""
    handle = await keel.client.start_workflow(
        BUNDLE_MEMORY_WORKFLOW, data, id=f"keel-bundle-memory-{data.request_id}",
        task_queue=keel.task_queue, result_type=BundleMemoryDone,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
    try:
        done: BundleMemoryDone = await handle.result()
    except WorkflowFailureError as err:
        raise _refusal(err) from None
    return done


async def export_session(keel: KeelClient, session_id: str, path: Path | None = None, *,
                         database_url: str | None = None, with_memory: bool = False) -> bytes:
    """The session's bundle (schemas.branch), written to `path` when given; `with_memory`:
    with its cards and daily-note entries (a version 2 bundle when it has any)."""
    from activities.bundle import drop_staged, export_bundle

    state = await session_state(keel.session(session_id))
    if state.pending or state.turn_in_progress is not None:
        raise BranchRefusedError(
            f"session {session_id} is in a turn ({len(state.pending)} input(s) waiting): "
            "export it once it is idle")
    url, staged = _url(keel, database_url), None
    if with_memory:
        scope = state.config.memory_scope
        if scope is None:
            raise BranchRefusedError(f"session {session_id} has no long memory (no memory "
                                     "scope): export it without its memory")
        staged = f"export-{uuid.uuid4().hex}"
        await memory_call(keel, BundleMemoryRequest(request_id=staged, direction="export",
                                                session_id=session_id, scope=scope))
    try:
        data = await export_bundle(url, state, _local(keel), staged)
    except BranchError as err:
        raise BranchRefusedError(str(err)) from None
    finally:
        if staged:
            await drop_staged(url, staged)
    if path is not None:
        path.write_bytes(data)
    return data


async def import_session(keel: KeelClient, bundle: bytes, new_id: str | None = None, *,
                         database_url: str | None = None, request_id: str | None = None,
                         trust: bool = False, agent: AgentSpec | None = None,
                         with_memory: bool = True,
                         memory_scope: str | None = None) -> ImportDone:
    """The bundle's session in this deployment (under `new_id`, else its own id), its
    workflow started with the bundle's state. The same bundle imported again under the
    same id (the default request id is the bundle's digest, the id and the trust) finds
    the first. A bundle this deployment did not seal is taken as its own only with
    `trust` (schemas.bundle_seal): without it, one whose agent would run or reach anything
    here is refused (unless `agent`, the importer's own, replaces it), as is one carrying
    long memory (unless `with_memory=False` leaves it out), and its harness inputs are
    labelled as imported unverified. `memory_scope`: the scope it goes on in, instead of
    the one the bundle names."""
    from activities.bundle import import_bundle, undo_import

    request_id = request_id or _import_request_id(bundle, new_id, trust, agent, with_memory,
                                                  memory_scope)
    url = _url(keel, database_url)

    def check(state: SessionState) -> None:  # refused as a start with this config would be
        config = state.config
        try:
            keel.start_input(new_id or state.session_id,
                             config.model_copy(update={"agent": None}), config.agent)
        except (StartRefusedError, AgentSpecRefusedError) as err:
            raise BranchError(f"the bundle's session could not start here: {err}") from None

    async def memory(done: ImportDone) -> None:  # the vault writes what the import staged
        scope = done.state.config.memory_scope or ""
        try:
            written = await memory_call(keel, BundleMemoryRequest(
                request_id=request_id, direction="import", session_id=done.session_id,
                scope=scope))
        except BranchRefusedError:  # the vault gave up (its retries spent): no half session
            await undo_import(url, done.session_id, request_id)
            raise
        if written.conflicts:
            await undo_import(url, done.session_id, request_id)
            raise BranchRefusedError(conflict_text(scope, written.conflicts))
        # (one forgotten since the import staged it: the vault left it out too)
        late = [p for p in written.forgotten if p not in done.forgotten_cards]
        done.forgotten_cards, done.cards = done.forgotten_cards + late, done.cards - len(late)

    try:
        done = await import_bundle(url, bundle, new_id, request_id, _local(keel), memory,
                                   trust=trust, agent=agent, with_memory=with_memory,
                                   trusted_keys=keel.settings.trusted_bundle_keys,
                                   memory_scope=memory_scope, check=check)
    except BranchError as err:
        raise BranchRefusedError(str(err)) from None
    state = done.state
    await _schedules(keel, state)
    try:
        await keel.client.start_workflow(
            SESSION_WORKFLOW, SessionInput(session_id=done.session_id, config=state.config,
                                           state=state),
            id=done.session_id, task_queue=keel.task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
    except WorkflowAlreadyStartedError:
        pass  # a retried import whose session ran (and ended) already
    return done


def _import_request_id(bundle: bytes, new_id: str | None, trust: bool,
                       agent: AgentSpec | None, with_memory: bool,
                       memory_scope: str | None) -> str:
    """An import's default request id: the bundle's digest, the id and each option, so
    the same import asked again finds the first and a different one is its own (the plain
    case keeps the id older imports used)."""
    given = agent.model_dump_json().encode() if agent is not None else b""
    return (f"import-{hashlib.sha256(bundle).hexdigest()[:32]}-{new_id}"
            + ("-trusted" if trust else "")
            + ("" if with_memory else "-without-memory")
            + (f"-scope-{memory_scope}" if memory_scope else "")
            + (f"-agent-{hashlib.sha256(given).hexdigest()[:16]}" if agent is not None else ""))


async def seal_public_key(keel: KeelClient, database_url: str | None = None) -> str:
    """This deployment's public key for bundle seals: what another deployment adds to its
    KEEL_TRUSTED_BUNDLE_KEYS to take this one's bundles as its own (schemas.bundle_seal)."""
    import psycopg

    from activities.bundle import seal_key
    from schemas.bundle_seal import public_key

    async with await psycopg.AsyncConnection.connect(_url(keel, database_url),
                                                     autocommit=True) as conn:
        return public_key(await seal_key(conn))


async def _schedules(keel: KeelClient, state: SessionState) -> None:
    """The schedules of the recurring wakeups an imported session brings, made for it here
    before it starts (a retried import finds them made); an expired one's is not made:
    the session drops it."""
    from activities.wakeups import WakeupScheduleInput, make_wakeup_schedule

    for wakeup in live_wakeups(state, datetime.now(UTC)):
        if wakeup.schedule_id:
            await make_wakeup_schedule(keel.client, WakeupScheduleInput(
                session_id=state.session_id, wakeup=wakeup, task_queue=keel.task_queue))


def _local(keel: KeelClient) -> LocalStore | None:
    """The deployment's local workspace folders, when it keeps workspaces so."""
    from activities.workspace import LocalStore, open_store

    store = open_store(keel.settings, pooled=False)
    return store if isinstance(store, LocalStore) else None


def _url(keel: KeelClient, database_url: str | None) -> str:
    url: Any = database_url or keel.settings.database_url
    if not url:
        raise BranchRefusedError("export and import read the record's database: set "
                                 "DATABASE_URL")
    return str(url)
