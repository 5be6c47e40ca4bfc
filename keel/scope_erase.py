"""Erasing a memory scope: `erase_memory_scope(keel, scope)`, or `keel vault erase --scope`
(what goes and why: schemas.vault.erase).

Invariants:
- Nothing is erased while a session of the scope runs, unless the caller asked for the
  scope's sessions to go too and for running ones to be stopped (`with_sessions`, `force`);
  nothing is erased either when no vault worker serves the vault's queue.
- With `with_sessions`, every session of the scope is deleted first (keel.deletion, one
  by one: a refusal stops there, the scope's memory untouched), then the scope.
- A running session (of this deployment's task queue, listed by visibility and confirmed by
  Temporal, since a listing may lag an end) is of the scope when its row says so (from its
  first model call on) or, with no row yet, when its workflow says so. One
  that starts in the scope after the check writes to a new vault of the scope; erasing
  again takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import TYPE_CHECKING

from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from keel._errors import DeleteRefusedError
from keel.deletion import delete_run, delete_session, on_the_vault, vault_served
from schemas.config import vault_queue
from schemas.session import SESSION_WORKFLOW, id_clause, visibility_quoted
from schemas.vault.erase import (
    ERASE_SCOPE_WORKFLOW,
    EraseScopeInput,
    ScopeErased,
    running_text,
)
from schemas.vault.nightly import (
    NIGHTLY_WORKFLOW,
    NightlyJob,
    nightly_child_id,
    now_run_prefix,
)
from schemas.vault.scope import ScopeError, check_scope

if TYPE_CHECKING:
    from keel.client import KeelClient

__all__ = ["erase_memory_scope"]

ASK_S = 3.0  # a running session asked its scope (all of them at once)


async def erase_memory_scope(keel: KeelClient, scope: str, *, with_sessions: bool = False,
                             force: bool = False,
                             database_url: str | None = None) -> ScopeErased:
    """Erase `scope`'s long memory (see the module's invariants); `DeleteRefusedError`
    says why not. The result says what went, and whether anything was there."""
    try:
        check_scope(scope)
    except ScopeError as err:
        raise DeleteRefusedError(str(err)) from None
    url = database_url or keel.settings.database_url
    if not url:
        raise DeleteRefusedError("erasing a memory scope deletes its index: set DATABASE_URL")
    await vault_served(keel, scope)
    running = await _running(keel, str(url), scope)
    if running and not (with_sessions and force):
        raise DeleteRefusedError(running_text(scope, running))
    deleted: list[str] = []
    if with_sessions:
        from keel.record import scope_sessions

        for session_id in sorted({*await scope_sessions(str(url), scope), *running}):
            try:
                await delete_session(keel, session_id, force=force, database_url=str(url),
                                     forget=False)  # its words go with the whole scope
            except DeleteRefusedError as err:
                if f"no session {session_id} " not in str(err):
                    raise DeleteRefusedError(
                        f"{err}; {len(deleted)} session(s) of scope {scope!r} were deleted "
                        "before it, and its long memory was not erased") from None
            deleted.append(session_id)
    done = await _erase(keel, scope)
    done.sessions_deleted = deleted
    done.runs = await _delete_memory_runs(keel, scope)
    return done


async def _running(keel: KeelClient, url: str, scope: str) -> list[str]:
    """The running sessions of `scope`, by id: visibility lists this deployment's running
    sessions (its task queue's: a scope's ended ones may be many more), each one's row
    says its scope, and one whose row does not say it yet (no row: started, no message so
    far; a row the record made before its first model call named the scope) is asked."""
    ids = [wf.id async for wf in keel.client.list_workflows(
        f"WorkflowType = '{SESSION_WORKFLOW}' AND ExecutionStatus = 'Running' AND "
        f"TaskQueue = '{visibility_quoted(keel.task_queue)}'")]
    if not ids:
        return []
    from keel.record import session_scopes  # (the client's import loads no psycopg)

    rows = await session_scopes(url, ids)
    unknown = [sid for sid in ids if rows.get(sid) is None]  # no row, or none says it yet
    asked = await asyncio.gather(*(_asked_scope(keel, sid) for sid in unknown))
    scopes = {**rows, **dict(zip(unknown, asked, strict=True))}
    ours = sorted(sid for sid in ids if scopes.get(sid) == scope)
    # Visibility may lag: a session ended a moment ago can still be listed as running.
    still = await asyncio.gather(*(_runs_now(keel, sid) for sid in ours))
    return [sid for sid, running in zip(ours, still, strict=True) if running]


async def _runs_now(keel: KeelClient, session_id: str) -> bool:
    """Whether the session's newest run runs, as Temporal says it now."""
    try:
        described = await keel.client.get_workflow_handle(session_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return described.status == WorkflowExecutionStatus.RUNNING


async def _asked_scope(keel: KeelClient, session_id: str) -> str | None:
    """The memory scope the session's workflow holds (None: none, or it did not answer
    within a few seconds: a session whose worker is away writes nothing meanwhile)."""
    from keel.branching import session_state

    with contextlib.suppress(Exception):
        state = await asyncio.wait_for(session_state(keel.session(session_id)), ASK_S)
        return state.config.memory_scope
    return None


async def _delete_memory_runs(keel: KeelClient, scope: str) -> int:
    """The scope's closed doctor and rollup runs out of Temporal: their reports name its
    card files (a person's name, often) and CORE.md lines. A run asked for now is found by
    its id's prefix; a nightly run's, as the child of each nightly run of this deployment."""
    found: list[tuple[str, str]] = []
    for job in NightlyJob:
        prefix = now_run_prefix(job, scope)
        own = re.compile(re.escape(prefix) + "[0-9a-f]{8}")
        found += [(wf.id, wf.run_id) async for wf in keel.client.list_workflows(
            f"{id_clause('WorkflowId', prefix, starts_with=True)} AND "
            "ExecutionStatus != 'Running'") if own.fullmatch(wf.id)]
    async for nightly in keel.client.list_workflows(
            f"WorkflowType = '{NIGHTLY_WORKFLOW}' AND "
            f"TaskQueue = '{visibility_quoted(vault_queue(keel.task_queue))}'"):
        child = keel.client.get_workflow_handle(nightly_child_id(nightly.id, scope))
        try:
            described = await child.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                continue  # that night's job did not run the scope
            raise
        if described.status != WorkflowExecutionStatus.RUNNING:
            found.append((described.id, described.run_id))
    unique = list(dict.fromkeys(found))
    for workflow_id, run_id in unique:
        await delete_run(keel, workflow_id, run_id)
    return len(unique)


async def _erase(keel: KeelClient, scope: str) -> ScopeErased:
    """The vault's side (workflows.erase_scope), through the vault's one writer."""
    return await on_the_vault(keel, ERASE_SCOPE_WORKFLOW, EraseScopeInput(scope=scope),
                              ScopeErased, scope=scope, kind="erase-scope",
                              not_done=f"long memory (scope {scope}) was not erased",
                              again="erase again")
