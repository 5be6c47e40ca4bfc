"""Erasing a memory scope: `erase_memory_scope(keel, scope)`, or `keel vault erase --scope`
(what goes and why: schemas.vault.erase).

Invariants:
- Nothing is erased while a session of the scope runs, unless the caller asked for the
  scope's sessions to go too and for running ones to be stopped (`with_sessions`, `force`);
  nothing is erased either when no vault worker serves the vault's queue.
- With `with_sessions`, every session of the scope is deleted first (keel.deletion, one
  by one: a refusal stops there, the scope's memory untouched), then the scope.
- A running session is of the scope when its row says so (from its first model call on)
  or, before that, when its workflow says so. One that starts in the scope after the
  check writes to a new vault of the scope; erasing again takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from typing import TYPE_CHECKING

from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from keel._errors import DeleteRefusedError
from keel.deletion import MEMORY_WAIT_S, delete_run, delete_session, vault_served
from schemas.session import SESSION_WORKFLOW
from schemas.vault.erase import (
    ERASE_SCOPE_WORKFLOW,
    EraseScopeInput,
    ScopeErased,
    running_text,
)
from schemas.vault.scope import DEFAULT_SCOPE, ScopeError, check_scope

if TYPE_CHECKING:
    from keel.client import KeelClient

__all__ = ["MEMORY_RUN_TYPES", "erase_memory_scope"]

ASK_S = 5.0  # a running session asked its scope
# The workflows that run over one scope's vault and report what they found there.
MEMORY_RUN_TYPES = ("DoctorWorkflow", "DailyRollupWorkflow", "WeeklyRollupWorkflow",
                    "MonthlyRollupWorkflow", "YearlyRollupWorkflow")


async def erase_memory_scope(keel: KeelClient, scope: str, *, with_sessions: bool = False,
                             force: bool = False,
                             database_url: str | None = None) -> ScopeErased:
    """Erase `scope`'s long memory (see the module's invariants); `DeleteRefusedError`
    says why not. The result says what went, and whether anything was there."""
    from activities.session_delete import scope_sessions

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
    """The running sessions of `scope`, by id: visibility lists the running sessions (a
    scope's ended ones may be many more), each one's row says its scope, and one whose row
    does not yet (no model call so far) is asked."""
    from activities.session_delete import session_scopes

    ids = [wf.id async for wf in keel.client.list_workflows(
        f"WorkflowType = '{SESSION_WORKFLOW}' AND ExecutionStatus = 'Running'")]
    if not ids:
        return []
    rows = await session_scopes(url, ids)
    return sorted({sid for sid in ids
                   if (rows.get(sid) or await _asked_scope(keel, sid)) == scope})


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
    card files (a person's name, often) and CORE.md lines. Found by id (a nightly run's
    child is `<nightly id>-<scope>`, a run asked for now `...-<scope>-<8 hex>`), each
    confirmed by the scope its input names."""
    types = ", ".join(f"'{t}'" for t in MEMORY_RUN_TYPES)
    ours = re.compile(rf"-{re.escape(scope)}(-[0-9a-f]{{8}})?$")
    gone = 0
    async for wf in keel.client.list_workflows(
            f"WorkflowType IN ({types}) AND ExecutionStatus != 'Running'"):
        if ours.search(wf.id) and await _input_scope(keel, wf.id, wf.run_id) == scope:
            await delete_run(keel, wf.id, wf.run_id)
            gone += 1
    return gone


async def _input_scope(keel: KeelClient, workflow_id: str, run_id: str) -> str | None:
    """The memory scope a doctor or rollup run was started for (its input's `scope`)."""
    history = await keel.client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    values = await keel.client.data_converter.decode(list(started.input.payloads))
    first = values[0] if values else None
    return first.get("scope", DEFAULT_SCOPE) if isinstance(first, dict) else None


async def _erase(keel: KeelClient, scope: str) -> ScopeErased:
    """The vault's side (workflows.erase_scope), through the vault's one writer."""
    handle = await keel.client.start_workflow(
        ERASE_SCOPE_WORKFLOW, EraseScopeInput(scope=scope, request_id=uuid.uuid4().hex),
        id=f"keel-erase-scope-{scope}-{uuid.uuid4().hex[:8]}", task_queue=keel.task_queue,
        result_type=ScopeErased)
    try:
        done: ScopeErased = await asyncio.wait_for(handle.result(), MEMORY_WAIT_S)
    except TimeoutError:
        raise DeleteRefusedError(
            f"long memory (scope {scope}) did not answer in {MEMORY_WAIT_S:.0f} s: is a "
            "vault worker running? Erase again once it answers") from None
    except WorkflowFailureError as err:
        said = err.cause.message if isinstance(err.cause, ApplicationError) else str(err)
        raise DeleteRefusedError(
            f"long memory (scope {scope}) was not erased: {said}; erase again") from None
    return done
