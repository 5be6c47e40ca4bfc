"""The session's activities: record an input, one model call, one tool call.

Each takes ids and sequence numbers, loads what it needs from the record, and returns a
small result. Each is idempotent: a retry after a crash finds its row and returns it.

A plain turn is one activity before its reply: the model call of a message asked while the
session was idle first writes that message to the record (idempotent by its seq and input
id, in at most RECORD_STEP_S; when it cannot, it fails as INPUT_NOT_RECORDED before anything
else, and the session's ordinary record takes over), then searches long memory (a read of
the index, at most RECALL_STEP_S; a failure is returned, and the turn goes on without),
then rebuilds the window from the record and asks the model. One task round trip and one
activity per turn fewer than recording, recalling and calling apart. `call_model` chains
the steps of activities.model_call; the request itself is built by a pure function
(`schemas.request.model_call_request`), and the model is asked in one method
(`_ask_model`).

Every activity here works over the worker's one session context (activities.context: the
pool, the store, the prompt and tools, the window loader, long memory), passed in.

Long memory is the session's scope's only: the workflow passes `memory_scope` (from the
session's config) to the model and tool calls; the model call mirrors it on the session's
row, from which every system prompt (the checkpoint turn's too) takes its core memory. The
memory tools take no scope or path from the model: a tool input naming one is refused.

What they insert is storable by construction: model output, tool input and tool output
have their NULs and lone surrogates replaced (`schemas.text.make_storable`) and the row
says so in its notes, so bad data never turns into a retry loop.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from anthropic.types import Message
from psycopg import AsyncConnection
from pydantic import BaseModel, Field, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.context import SessionContext
from activities.events import DeltaPublisher
from activities.heartbeat import with_heartbeat
from activities.model_call import (
    INPUT_NOT_RECORDED,
    MemoryStep,
    ModelAsk,
    ModelCallInput,
    ModelCallResult,
    RecordStep,
    RoomSteps,
    WindowSpan,
    insert_reply,
    load_request,
    recall_step,
    record_first,
    reply_from_row,
    retried_elsewhere,
    size_request,
)
from activities.record import (
    FenceInput,
    Inserted,
    NewRow,
    RecordInput,
    ensure_session,
    fence_seq,
    insert_row,
    load_seqs,
)
from activities.tools import ToolContext, ToolOutput, execute_tool
from activities.vault.search import search, touch_documents
from activities.vault.store import VaultError
from schemas.agent import cut_result
from schemas.checkpoint.policy import sendable
from schemas.events import SHORT_OUTPUT_CHARS, DeltaTail, cut
from schemas.messages import MessageType
from schemas.request import model_call_request
from schemas.text import make_storable, make_storable_json
from schemas.tools import MEMORY_TOOLS
from schemas.vault.card import CardFact
from schemas.vault.recall import fence_memory
from schemas.vault.scope import DEFAULT_SCOPE, tool_scope_problem

__all__ = [
    "INPUT_NOT_RECORDED", "MemoryStep", "ModelAsk", "ModelCallInput", "ModelCallResult",
    "RecordInput", "RecordStep", "RoomSteps", "SessionActivities", "ToolInput", "ToolOutcome",
    "ToolResultInput", "WindowSpan",
]


class ToolInput(BaseModel):
    session_id: str
    turn: int
    assistant_seq: int
    tool_use_id: str
    result_seq: int
    upto_seq: int
    memory_scope: str | None = DEFAULT_SCOPE  # the session's; None: no long memory


class ToolResultInput(BaseModel):
    """A result computed outside this worker (a service tool, an MCP call, a refusal) to
    record as the call's tool result, cut to `cap` characters."""

    session_id: str
    turn: int
    tool_use_id: str
    result_seq: int
    tool: str
    text: str
    is_error: bool = False
    cap: int = 20_000
    meta: dict[str, Any] = Field(default_factory=dict)


class ToolOutcome(BaseModel):
    seq: int
    token_count: int
    is_error: bool
    preview: str = ""  # the result's start, for the event stream (schemas.events cuts it)


class SessionActivities:
    """The session's activities over one worker's session context (activities.context)."""

    def __init__(self, ctx: SessionContext) -> None:
        self.ctx = ctx

    @activity.defn
    async def record_input(self, data: RecordInput) -> Inserted:
        async with await self.ctx.connection() as conn:
            await ensure_session(conn, data.session_id, data.user_name)
            return await insert_row(conn, data)

    @activity.defn
    async def fence_seq(self, data: FenceInput) -> Inserted:
        """The tombstone over a seq the session gave up on (see activities.record)."""
        async with await self.ctx.connection() as conn:
            return await fence_seq(conn, data)

    @activity.defn
    async def call_model(self, data: ModelCallInput) -> ModelCallResult:
        recorded = await record_first(self.ctx, data.first)
        if retried_elsewhere(data.first, recorded):
            return ModelCallResult(recorded=recorded)
        async with await self.ctx.connection() as conn:
            first = await recall_step(self.ctx, conn, data.memory, recorded)
            done = await load_seqs(conn, data.session_id, [data.reply_seq])
            if done:  # a retry after the reply was recorded: do not ask the model again
                return first.result(reply=reply_from_row(done[0], data.ask.model))
            block = first.recall.block if first.recall is not None else data.memory.block
            loaded = await load_request(self.ctx, conn, data, block)
            sized = size_request(loaded, data)
            if not sendable(sized.size, room_asked=data.room.asked):
                return first.result(size=sized.size, estimated_tokens=sized.estimate)
            request, notes = model_call_request(
                model=data.ask.model, max_tokens=data.ask.window.max_output_tokens,
                system=loaded.window.system, rows=sized.rows,
                checkpoint_text=loaded.window.checkpoint_text, memory_block=block,
                tools=loaded.tools)
            message, tail = await self._ask_model(data, request)
            reply, replaced = await insert_reply(conn, data, message)
            return first.result(reply=reply, size=sized.size, estimated_tokens=sized.estimate,
                                output_cut=sized.output_cut, notes=sized.notes + notes,
                                replaced=replaced, stream_tail=tail)

    async def _ask_model(self, data: ModelCallInput,
                         request: dict[str, Any]) -> tuple[Message, DeltaTail | None]:
        """The model's reply; its text streamed onto the session's events as it comes, but
        for the end no delta carried yet, returned for the workflow to publish."""
        provider = data.ask.agent.provider if data.ask.agent else None
        try:
            model = self.ctx.settings.model_for(provider)
        except KeyError:
            raise ApplicationError(f"provider profile {provider!r} is unknown to this "
                                   "worker", non_retryable=True) from None
        if not self.ctx.settings.model.stream:
            return await with_heartbeat(self.ctx.model.create(model, request)), None
        deltas = DeltaPublisher.for_activity(data.session_id, data.turn, data.reply_seq)
        async with deltas:  # closed on the way out, whatever happens (finish() first)
            message = await with_heartbeat(self.ctx.model.stream(model, request, deltas.add))
            return message, await deltas.finish()

    @activity.defn
    async def run_tool(self, data: ToolInput) -> ToolOutcome:
        async with await self.ctx.connection() as conn:
            input_id = f"result-{data.tool_use_id}"
            existing = await (await conn.execute(
                "SELECT seq, token_count, content, content_text FROM messages"
                " WHERE session_id=%s"
                " AND input_id=%s", (data.session_id, input_id))).fetchone()
            if existing:
                return ToolOutcome(seq=existing[0], token_count=existing[1],
                                   is_error=bool((existing[2] or {}).get("is_error")),
                                   preview=cut(existing[3] or "", SHORT_OUTPUT_CHARS))
            assistant = await load_seqs(conn, data.session_id, [data.assistant_seq])
            call = next((b for b in (assistant[0].content or []) if isinstance(b, dict)
                         and b.get("id") == data.tool_use_id), None) if assistant else None
            if call is None:
                raise ApplicationError(f"tool call {data.tool_use_id} not in the record",
                                       non_retryable=True)
            ctx = ToolContext(session_id=data.session_id, store=self.ctx.store,
                              skills=await self.ctx.prompt.skills(), conn=conn,
                              upto_seq=data.upto_seq, op_id=f"tool:{data.tool_use_id}")
            if call["name"] in MEMORY_TOOLS:
                output = await self._memory_tool(conn, data, call["name"],
                                                 call.get("input") or {})
            else:
                output = await execute_tool(ctx, call["name"], call.get("input") or {})
            text, replaced = make_storable(output.text)
            if replaced:
                text += f"\n[Keel: {'; '.join(replaced)}]"
            content, meta_replaced = make_storable_json(
                {"tool_use_id": data.tool_use_id, "is_error": output.is_error,
                 "tool": call["name"], **output.meta})
            if replaced or meta_replaced:
                content["notes"] = replaced + meta_replaced
            inserted = await insert_row(conn, NewRow(
                session_id=data.session_id, seq=data.result_seq, input_id=input_id,
                type=MessageType.TOOL_RESULT, text=text, turn=data.turn, content=content))
            return ToolOutcome(seq=inserted.seq, token_count=inserted.token_count,
                               is_error=output.is_error,
                               preview=cut(output.text, SHORT_OUTPUT_CHARS))

    @activity.defn
    async def record_tool_result(self, data: ToolResultInput) -> ToolOutcome:
        """Record a result made elsewhere (service tool, MCP, refusal); idempotent by the
        call's id. A result over its cap is cut, and the line says so."""
        text, cut = cut_result(data.text, data.cap,
                               "ask the tool for a smaller part if you need the rest")
        async with await self.ctx.connection() as conn:
            inserted = await insert_row(conn, NewRow(
                session_id=data.session_id, seq=data.result_seq,
                input_id=f"result-{data.tool_use_id}", type=MessageType.TOOL_RESULT,
                text=text, turn=data.turn,
                content={"tool_use_id": data.tool_use_id, "is_error": data.is_error,
                         "tool": data.tool, "cut": cut, **data.meta}))
        return ToolOutcome(seq=inserted.seq, token_count=inserted.token_count,
                           is_error=data.is_error)

    async def _memory_tool(self, conn: AsyncConnection, data: ToolInput, name: str,
                           args: dict[str, Any]) -> ToolOutput:
        if data.memory_scope is None:
            return ToolOutput(f"{name} failed: this session has no long memory", is_error=True)
        allowed = ({"query", "limit"} if name == "memory_search"
                   else set(CardFact.model_fields))
        problem = tool_scope_problem(name, args, allowed)
        if problem:
            return ToolOutput(problem, is_error=True)
        memory = self.ctx.memory().scoped(data.memory_scope)
        if name == "memory_search":
            query = str(args.get("query", "")).strip()
            if not query:
                return ToolOutput("query is empty", is_error=True)
            hits = await search(conn, query, scope=memory.scope,
                                k=max(1, min(int(args.get("limit", 5)), 10)),
                                exclude_session=data.session_id, embedder=self.ctx.embedder)
            await touch_documents(conn, [h.path for h in hits], scope=memory.scope)
            return ToolOutput(fence_memory(hits) or f"nothing in long memory for {query!r}")
        try:
            fact = CardFact.model_validate(args)
        except ValidationError as err:
            return ToolOutput(f"write_card refused: {err}", is_error=True)
        vault = memory.vault
        try:
            await asyncio.to_thread(vault.ensure)
            today = vault.local_date(datetime.now(vault.tz()))
            # The op id is the call's own id: a retried activity writes the card once.
            (out,) = await vault.apply_facts(await memory.pool(),
                                             [(f"tool:{data.tool_use_id}", fact)], today)
        except (VaultError, ValueError, OSError) as err:
            return ToolOutput(f"write_card failed: {err}", is_error=True)
        return ToolOutput(f"{out.op.value} {out.path or ''} {out.note}".strip(),
                          meta={"card": out.path})

