"""The agent's long-memory tools, as a session's tool call runs them (activities.session's
run_tool): `memory_search` and `write_card`.

Invariants:
- A call works in the session's memory scope only (`MemoryCall.scope`, from its config,
  never from the tool input): an input that names a scope, a vault path or a document id
  is refused with an error result (schemas.vault.scope.tool_scope_problem); a session
  without long memory gets an error result.
- `memory_search` reads PostgreSQL only (it runs on any worker); what it finds is fenced as
  reference, not instructions (schemas.vault.recall). `write_card` writes the card under
  the op id of the session and the call, so a retried activity writes it once.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from pydantic import BaseModel, ValidationError

from activities.context import SessionContext
from activities.tools import ToolOutput
from activities.vault.search import search, touch_documents
from activities.vault.store import VaultError
from schemas.bundle_memory import card_op_id
from schemas.vault.card import CardFact
from schemas.vault.recall import fence_memory
from schemas.vault.scope import tool_scope_problem

__all__ = ["MemoryCall", "memory_tool"]


class MemoryCall(BaseModel):
    """Who calls a memory tool: the session, its call, its scope (None: no long memory),
    and the first seq of its live window (memory_search leaves its own entries from there
    on out: the model sees them already)."""

    session_id: str
    tool_use_id: str
    scope: str | None
    live_from_seq: int | None = None


async def memory_tool(ctx: SessionContext, conn: AsyncConnection, call: MemoryCall,
                      name: str, args: dict[str, Any]) -> ToolOutput:
    """One call of a memory tool `name` with input `args`, as its result."""
    if call.scope is None:
        return ToolOutput(f"{name} failed: this session has no long memory", is_error=True)
    allowed = ({"query", "limit"} if name == "memory_search"
               else set(CardFact.model_fields))
    problem = tool_scope_problem(name, args, allowed)
    if problem:
        return ToolOutput(problem, is_error=True)
    if name == "memory_search":
        return await _search(ctx, conn, call, args)
    return await _write_card(ctx, call, args)


async def _search(ctx: SessionContext, conn: AsyncConnection, call: MemoryCall,
                  args: dict[str, Any]) -> ToolOutput:
    assert call.scope is not None
    query = str(args.get("query", "")).strip()
    if not query:
        return ToolOutput("query is empty", is_error=True)
    scope = ctx.memory().scoped(call.scope).scope
    hits = await search(conn, query, scope=scope,
                        k=max(1, min(int(args.get("limit", 5)), 10)),
                        exclude_session=call.session_id, live_from_seq=call.live_from_seq,
                        embedder=ctx.embedder)
    await touch_documents(conn, [h.path for h in hits], scope=scope)
    found = fence_memory(hits) or f"nothing in long memory for {query!r}"
    return ToolOutput("\n".join(filter(None, (hits.spelling_note(), found))))


async def _write_card(ctx: SessionContext, call: MemoryCall,
                      args: dict[str, Any]) -> ToolOutput:
    assert call.scope is not None
    try:
        fact = CardFact.model_validate(args)
    except ValidationError as err:
        return ToolOutput(f"write_card refused: {err}", is_error=True)
    memory = ctx.memory().scoped(call.scope)
    vault = memory.vault
    try:
        await asyncio.to_thread(vault.ensure)
        today = vault.local_date(datetime.now(vault.tz()))
        # The op id is the session's and the call's: a retried activity writes the card
        # once, and another session's call of the same id writes its own.
        (out,) = await vault.apply_facts(await memory.pool(),
                                         [(card_op_id(call.session_id, call.tool_use_id),
                                           fact)], today)
    except (VaultError, ValueError, OSError) as err:
        return ToolOutput(f"write_card failed: {err}", is_error=True)
    return ToolOutput(f"{out.op.value} {out.path or ''} {out.note}".strip(),
                      meta={"card": out.path})
