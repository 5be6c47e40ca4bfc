"""Erasing a memory scope: `erase_memory_scope(keel, scope)`, or `keel vault erase --scope`
(what goes and why: schemas.vault.erase).

Invariants:
- Nothing is erased while a session of the scope runs, unless the caller asked for the
  scope's sessions to go too and for running ones to be stopped (`with_sessions`, `force`);
  nothing is erased either when no vault worker serves the vault's queue.
- With `with_sessions`, every session of the scope is deleted first (keel.deletion, one
  by one: a refusal stops there, the scope's memory untouched), then the scope.
- A session that starts in the scope after the check writes to a new vault of the scope;
  erasing again takes it.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from keel._errors import DeleteRefusedError
from keel.deletion import MEMORY_WAIT_S, delete_session, vault_served
from schemas.session import SESSION_WORKFLOW
from schemas.vault.erase import (
    ERASE_SCOPE_WORKFLOW,
    EraseScopeInput,
    ScopeErased,
    running_text,
)
from schemas.vault.scope import ScopeError, check_scope

if TYPE_CHECKING:
    from keel.client import KeelClient

__all__ = ["erase_memory_scope"]


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
    members = await scope_sessions(str(url), scope)
    running = await _running(keel, set(members))
    if running and not (with_sessions and force):
        raise DeleteRefusedError(running_text(scope, running))
    deleted: list[str] = []
    if with_sessions:
        for session_id in members:
            try:
                await delete_session(keel, session_id, force=force, database_url=str(url))
            except DeleteRefusedError as err:
                if f"no session {session_id} " not in str(err):
                    raise DeleteRefusedError(
                        f"{err}; {len(deleted)} session(s) of scope {scope!r} were deleted "
                        "before it, and its long memory was not erased") from None
            deleted.append(session_id)
    done = await _erase(keel, scope)
    done.sessions_deleted = deleted
    return done


async def _running(keel: KeelClient, members: set[str]) -> list[str]:
    """Those of `members` whose session workflow runs now, by id (visibility lists the
    running sessions; a scope's ended sessions may be many more)."""
    if not members:
        return []
    found = {wf.id async for wf in keel.client.list_workflows(
        f"WorkflowType = '{SESSION_WORKFLOW}' AND ExecutionStatus = 'Running'")
        if wf.id in members}
    return sorted(found)


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
