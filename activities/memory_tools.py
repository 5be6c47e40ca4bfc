"""The agent's long-memory tools, as a session's tool call runs them (activities.session's
run_tool): `memory_search`, `memory_get` and `write_card`.

Invariants:
- A call works in the session's memory scope only (`MemoryCall.scope`, from its config,
  never from the tool input): an input that names a scope, a vault path or a document id
  is refused with an error result (schemas.vault.scope.tool_scope_problem); a session
  without long memory gets an error result.
- `memory_search` reads PostgreSQL only (it runs on any worker); what it finds is fenced as
  reference, not instructions (schemas.vault.recall). `write_card` writes the card under
  the op id of the session and the call, so a retried activity writes it once.
- `memory_get` reads one document of the scope's index whole (a card, a summary, a
  transcript entry, or a day's entries together), fenced the same way and cut to
  `GET_CHARS`; for one message of a transcript, the files it carried come from the record
  (its row, while its session is kept) into this session's workspace and are shown to
  the model with the result, as a tool's files are (activities.attachments): long memory
  keeps what a person showed the agent, not only what they said. Reads PostgreSQL only.
"""

from __future__ import annotations

import asyncio
import base64
from datetime import datetime
from typing import Any, TypeGuard

from psycopg import AsyncConnection
from pydantic import BaseModel, ValidationError

from activities.attachments import keep_named
from activities.context import SessionContext
from activities.tools import ToolOutput
from activities.vault.search import read_document, search, touch_documents
from activities.vault.store import VaultError
from schemas.agent import DEFAULT_OUTPUT_CAP_CHARS
from schemas.attachments import attachments_of
from schemas.bundle_memory import card_op_id
from schemas.vault.card import CardFact
from schemas.vault.recall import document_part, fence_memory
from schemas.vault.rollup import without_markers
from schemas.vault.scope import tool_scope_problem

__all__ = ["GET_CHARS", "MemoryCall", "memory_tool"]

GET_CHARS = DEFAULT_OUTPUT_CAP_CHARS  # of a document memory_get reads


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
    allowed = {"memory_search": {"query", "limit"}, "memory_get": {"path", "offset"}}.get(
        name, set(CardFact.model_fields))
    problem = tool_scope_problem(name, args, allowed)
    if problem:
        return ToolOutput(problem, is_error=True)
    if name == "memory_search":
        return await _search(ctx, conn, call, args)
    if name == "memory_get":
        offset = args.get("offset", 0)
        if not _whole(offset) or offset < 0:
            return ToolOutput(f"memory_get refused: offset {str(offset)[:40]!r} is not a "
                              "count of characters (0 or more)", is_error=True)
        return await _get(ctx, conn, call, str(args.get("path") or "").strip(), offset)
    return await _write_card(ctx, call, args)


def _whole(value: object) -> TypeGuard[int]:
    """Whether a tool input's number is a whole number (JSON's true is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


async def _search(ctx: SessionContext, conn: AsyncConnection, call: MemoryCall,
                  args: dict[str, Any]) -> ToolOutput:
    assert call.scope is not None
    query = str(args.get("query", "")).strip()
    if not query:
        return ToolOutput("query is empty", is_error=True)
    limit = args.get("limit", 5)
    if not _whole(limit):
        return ToolOutput(f"memory_search refused: limit {str(limit)[:40]!r} is not a whole "
                          "number of hits (1 to 10)", is_error=True)
    scope = ctx.memory().scoped(call.scope).scope
    hits = await search(conn, query, scope=scope, k=max(1, min(limit, 10)),
                        exclude_session=call.session_id, live_from_seq=call.live_from_seq,
                        embedder=ctx.embedder)
    await touch_documents(conn, [h.path for h in hits], scope=scope)
    found = fence_memory(hits) or f"nothing in long memory for {query!r}"
    return ToolOutput("\n".join(filter(None, (hits.spelling_note(), found))))


async def _get(ctx: SessionContext, conn: AsyncConnection, call: MemoryCall,
               path: str, offset: int = 0) -> ToolOutput:
    """One document of the scope's long memory whole, or a day's transcript, from
    `offset`, in parts of GET_CHARS; a message's files shown with it."""
    assert call.scope is not None
    if not path:
        return ToolOutput("memory_get refused: path is empty (take one memory_search gave)",
                          is_error=True)
    scope = ctx.memory().scoped(call.scope).scope
    found = await read_document(conn, path, scope=scope)
    if found is None:
        return ToolOutput(f"memory_get: nothing at {path[:200]!r} in long memory (take a "
                          "path memory_search gave)", is_error=True)
    body = without_markers(found.body)
    if offset and offset >= len(body):
        return ToolOutput(f"memory_get: {path[:200]!r} has {len(body):,} characters; offset "
                          f"{offset:,} is past its end", is_error=True)
    await touch_documents(conn, [path], scope=scope)
    text = document_part(path, found.title, found.kind, body, offset, GET_CHARS)
    if found.kind != "daily" or found.session_id is None or found.seq is None:
        return ToolOutput(text)
    paths, said = await _message_files(ctx, conn, call, found.session_id, found.seq)
    return ToolOutput("\n".join([text, *said]), meta={"images": paths} if paths else {})


async def _message_files(ctx: SessionContext, conn: AsyncConnection, call: MemoryCall,
                         session_id: str, seq: int) -> tuple[list[str], list[str]]:
    """The files of the message at (`session_id`, `seq`) put in the calling session's
    workspace to be shown with the result; lines for those that are not."""
    row = await (await conn.execute(
        "SELECT content FROM messages WHERE session_id = %s AND seq = %s"
        " AND type IN ('user', 'harness')"
        " AND jsonb_typeof(content->'attachments') = 'array'", (session_id, seq))).fetchone()
    if row is None:
        return [], []
    named: list[tuple[str, str, bytes | None, bool]] = []
    said: list[str] = []
    for i, item in enumerate(attachments_of(row[0])):
        name = str(item.get("name") or f"file-{i + 1}")
        if item.get("refused"):
            said.append(f"[file {i + 1} ({name}) not shown: the model refused it before]")
        elif isinstance(item.get("data"), str):
            named.append((f"file {i + 1} ({name})", name, base64.b64decode(item["data"]),
                          False))
    paths, unkept = await keep_named(ctx.store, call.session_id,
                                     f"memory-{call.tool_use_id}", named)
    return paths, said + unkept


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
