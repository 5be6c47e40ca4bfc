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
import json
from contextlib import AsyncExitStack, suppress
from typing import Any

from anthropic.types import Message
from psycopg import AsyncConnection
from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.exceptions import ApplicationError

from activities.attachments import (
    ResolveAttachments,
    ShareFiles,
    keep_files,
    mark_refused,
    resolve,
    share,
    stored_files,
    with_attachments,
    with_bytes,
)
from activities.context import SessionContext
from activities.delegate_ahead import start_ahead, tell_parent
from activities.events import DeltaPublisher, tell_retrying
from activities.handback import HandBack, HandedHome, hand_back
from activities.heartbeat import beating, with_heartbeat
from activities.interrupt import send_interrupt, stop_on_interrupt, watcher
from activities.memory_tools import MemoryCall, memory_tool
from activities.model_call import (
    INPUT_NOT_RECORDED,
    FirstSteps,
    LoadedRequest,
    MemoryStep,
    ModelAsk,
    ModelCallInput,
    ModelCallResult,
    RecordStep,
    RoomSteps,
    SizedRequest,
    WindowReads,
    WindowSpan,
    build_request,
    insert_interrupted,
    insert_reply,
    queue_reply_transcript,
    recall_step,
    record_and_read,
    refusal,
    reply_from_row,
    retried_elsewhere,
    size_request,
    transcribes,
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
    reply_part,
)
from activities.results import cut_input, keep_whole, read_payload
from activities.tools import ToolContext, execute_tool
from activities.workspace import PromptFiles, StoreError, WorkspaceStore
from schemas.agent import cut_result, fallback_model, result_files, result_text
from schemas.attachments import MAX_REQUEST_ATTACHMENTS, Attachment, refused_file
from schemas.budget import cost_usd, reply_price
from schemas.cache_ttl import lifetime_refused, short_lived
from schemas.checkpoint.policy import sendable
from schemas.events import SHORT_OUTPUT_CHARS, DeltaTail, cut
from schemas.events import cut as cut_preview
from schemas.messages import MessageType, ModelReply
from schemas.model import MODEL_CALL_ATTEMPTS, PROMPT_TOO_LONG
from schemas.request import model_call_request
from schemas.session import ReadReply, ReplyPart
from schemas.text import make_storable, make_storable_json
from schemas.tools import MEMORY_TOOLS
from schemas.vault.scope import DEFAULT_SCOPE

__all__ = [
    "INPUT_NOT_RECORDED", "InterruptInput", "MemoryStep", "ModelAsk", "ModelCallInput",
    "ModelCallResult", "RecordInput", "RecordStep", "RoomSteps", "SessionActivities",
    "ToolInput", "ToolOutcome", "ToolResultInput", "WindowSpan",
]


class InterruptInput(BaseModel):
    session_id: str
    reply_seq: int  # the model call's reply seq


class ToolInput(BaseModel):
    session_id: str
    turn: int
    assistant_seq: int
    tool_use_id: str
    result_seq: int
    upto_seq: int
    memory_scope: str | None = DEFAULT_SCOPE  # the session's; None: no long memory
    # The first seq of the session's live window (its start, or its turn's first input
    # when a checkpoint carried that): memory_search leaves out the session's own entries
    # from there on, not those checkpoints moved out. None: all of them (as before).
    live_from_seq: int | None = None


class ToolResultInput(BaseModel):
    """A result computed outside this worker (a service tool, an MCP call, a refusal) to
    record as the call's tool result, cut to `cap` characters. A service tool's result kept
    by reference comes as `ref` (`schemas.agent.result_ref`) with an empty `text`: this
    activity reads it, keeps it whole when it is over `cap`, and records it cut."""

    session_id: str
    turn: int
    tool_use_id: str
    result_seq: int
    tool: str
    text: str
    is_error: bool = False
    cap: int = 20_000
    meta: dict[str, Any] = Field(default_factory=dict)
    ref: dict[str, str] | None = None
    # A service tool's files (schemas.agent.result_files: names, base64), put in the
    # workspace here and sent with the result; one kept by reference brings its own.
    files: list[dict[str, str]] = Field(default_factory=list)


class ToolOutcome(BaseModel):
    seq: int
    token_count: int
    is_error: bool
    preview: str = ""  # the result's start, for the event stream (schemas.events cuts it)


class ReadReplyInput(ReadReply):
    session_id: str


class SessionActivities:
    """The session's activities over one worker's session context (activities.context)."""

    def __init__(self, ctx: SessionContext) -> None:
        self.ctx = ctx

    @activity.defn
    @beating
    async def record_input(self, data: RecordInput) -> Inserted:
        data = await with_attachments(self.ctx.store, await cut_input(self.ctx.store, data))
        async with await self.ctx.connection() as conn:
            await ensure_session(conn, data.session_id, data.user_name)
            return await insert_row(conn, data)

    @activity.defn
    async def resolve_attachments(self, data: ResolveAttachments) -> list[Attachment]:
        """A message's files described from the workspace, or ATTACHMENT_REFUSED."""
        return await resolve(self.ctx.store, data)

    @activity.defn
    async def share_files(self, data: ShareFiles) -> list[Attachment]:
        """A delegate call's files copied to its child's workspace, or FILES_REFUSED."""
        return await share(self.ctx.store, data)

    @activity.defn
    async def hand_back_files(self, data: HandBack) -> str:
        """A child's files made or changed, copied to its parent's workspace; the line its
        answer ends with (histories from before `hand_back_home`)."""
        return (await with_heartbeat(hand_back(self.ctx.store, data))).line

    @activity.defn
    async def hand_back_home(self, data: HandBack) -> HandedHome:
        """A child's files made or changed, copied to its parent's workspace; the line its
        answer ends with and the images shown with it."""
        return await with_heartbeat(hand_back(self.ctx.store, data))

    @activity.defn
    async def interrupt_model_call(self, data: InterruptInput) -> None:
        """Stop the model call answering at `data.reply_seq`, on whichever worker it runs."""
        async with await self.ctx.connection() as conn:
            await send_interrupt(conn, data.session_id, data.reply_seq)

    @activity.defn
    @beating
    async def fence_seq(self, data: FenceInput) -> Inserted:
        """The tombstone over a seq the session gave up on (see activities.record)."""
        async with await self.ctx.connection() as conn:
            return await fence_seq(conn, data)

    @activity.defn
    async def call_model(self, data: ModelCallInput) -> ModelCallResult:
        # Long memory is searched on a connection of its own, and the prompt's files read
        # from the store, while the input is recorded and the window loads (the recall
        # leaves the session's own messages out).
        recalling = asyncio.create_task(recall_step(self.ctx, data.memory))
        files = asyncio.create_task(self.ctx.prompt.files_in(data.session_id,
                                                             data.memory.scope))
        try:
            async with AsyncExitStack() as stack:
                conn, recorded, reads = await record_and_read(self.ctx, data, stack)
                if retried_elsewhere(data.first, recorded):
                    return ModelCallResult(recorded=recorded)
                return await self._answer(conn, data, recorded, reads, recalling, files)
        finally:
            for task in (recalling, files):
                if not task.done():
                    task.cancel()
            with suppress(asyncio.CancelledError):
                await recalling
            with suppress(BaseException):
                await files

    async def _answer(self, conn: AsyncConnection, data: ModelCallInput,
                      recorded: list[Inserted], reads: WindowReads,
                      recalling: asyncio.Task[FirstSteps],
                      files: asyncio.Task[PromptFiles]) -> ModelCallResult:
        """The model call's steps after the record: the window, the size, the model's
        reply recorded with its transcript's queue row."""

        async def first_steps() -> FirstSteps:
            first = await recalling
            first.recorded = recorded
            return first

        if reads.reply is not None:  # a retry after the reply was recorded: do not ask
            # the model again (its transcript was queued with it, in the same transaction)
            reply = reply_from_row(reads.reply, data.ask.model)
            return await _delegation(self.ctx.store, data, reply, (await first_steps()).result(
                reply=reply, transcribed=transcribes(data)))
        loaded = await build_request(self.ctx, data, reads, await files)
        first = await first_steps()
        block = first.recall.block if first.recall is not None else data.memory.block
        loaded.memory_block = block
        sized = size_request(loaded, data)
        if not sendable(sized.size, room_asked=data.room.asked):
            return first.not_sent(sized, loaded, data)
        try:
            message, tail, partial, notes = await self._ask_past_refused_files(
                conn, data, sized, loaded, first)
        except ApplicationError as err:
            if err.type != PROMPT_TOO_LONG:
                await tell_retrying(data.session_id, data.turn, err, MODEL_CALL_ATTEMPTS,
                                    data.ask.model, fallback_model(
                                        data.ask.agent, self.ctx.settings.model.fallback_model))
                raise
            # Not a failure: the ladder's input. The API's count corrects the estimate
            # and the session makes room (workflows.turn).
            return first.not_sent(sized, loaded, data, refusal(err, sized.estimate))
        # The reply and its transcript's queue row: both recorded or neither (sent as a
        # pipeline: two round trips for the transaction's four statements).
        async with conn.pipeline(), conn.transaction():
            if message is None:  # interrupted: what streamed is kept, marked so
                reply = await insert_interrupted(conn, data, partial, sized.estimate)
                replaced: list[str] = []
            else:
                reply, replaced = await insert_reply(conn, data, message)
            transcribed = await queue_reply_transcript(conn, data, reply, first.recall)
        reply.cost_usd = cost_usd(reply.usage, reply_price(reply.model, data.ask.model,
                                                           self.ctx.settings.prices))
        if message is None:
            return first.result(reply=reply, size=sized.size,
                                estimated_tokens=sized.estimate, stream_tail=tail,
                                transcribed=transcribed)
        return await _delegation(self.ctx.store, data, reply, first.result(
            reply=reply, size=sized.size, estimated_tokens=sized.estimate,
            output_cut=sized.output_cut, notes=sized.notes + notes, replaced=replaced,
            stream_tail=tail, transcribed=transcribed))

    async def _ask_past_refused_files(
        self, conn: AsyncConnection, data: ModelCallInput, sized: SizedRequest,
        loaded: LoadedRequest, first: FirstSteps,
    ) -> tuple[Message | None, DeltaTail | None, str, list[str]]:
        """The request built and asked (`_ask_model_within`); when the API refuses a file a
        user attached, the record marks it refused and the request is built again without
        it (activities.attachments.mark_refused), at most once a file."""
        for _ in range(MAX_REQUEST_ATTACHMENTS + 1):
            rows = await with_bytes(conn, data.session_id, sized.rows)
            request, notes = model_call_request(
                model=data.ask.model, max_tokens=data.ask.window.max_output_tokens,
                system=loaded.window.system, rows=rows,
                checkpoint_text=loaded.window.checkpoint_text,
                memory_block=loaded.memory_block, tools=loaded.tools,
                turn_first_seq=data.span.keep_recent_seq, cache_ttl=data.ask.cache_ttl)
            try:
                return (*await self._ask_model_within(conn, data, request, first), notes)
            except ApplicationError as err:
                file = refused_file(str(err), request, [(r.seq, r.content) for r in rows])
                if file is None:
                    raise
                activity.logger.warning("the model API refused file %d of #%d (%s): asking "
                                        "without it", file[1], file[0], file[2])
                sized.rows = await mark_refused(conn, data.session_id, sized.rows, *file)
        raise ApplicationError("the model API refused every file of the request",
                               non_retryable=True)

    async def _ask_model_within(self, conn: AsyncConnection, data: ModelCallInput,
                                request: dict[str, Any], first: FirstSteps,
                                ) -> tuple[Message | None, DeltaTail | None, str]:
        """`_ask_model`; when the API refused the request's hour-long cache lifetime (a
        provider that does not take it), the same request with the default, once, and
        the result says so (the session stops asking)."""
        try:
            return await self._ask_model(conn, data, request)
        except ApplicationError as err:
            if not lifetime_refused(err.type, str(err), data.ask.cache_ttl):
                raise
            activity.logger.warning("the model API refused the hour's cache lifetime (%s):"
                                    " asking with the default", err)
        first.cache_ttl_refused = True
        return await self._ask_model(conn, data, short_lived(request))

    async def _ask_model(self, conn: AsyncConnection, data: ModelCallInput,
                         request: dict[str, Any],
                         ) -> tuple[Message | None, DeltaTail | None, str]:
        """The model's reply; its text streamed onto the session's events as it comes, but
        for the end no delta carried yet, returned for the workflow to publish. None when
        a new message interrupted it, with the text that streamed (activities.interrupt)."""
        provider = data.ask.agent.provider if data.ask.agent else None
        try:
            model = self.ctx.settings.model_for(provider)
        except KeyError:
            raise ApplicationError(f"provider profile {provider!r} is unknown to this "
                                   "worker", non_retryable=True) from None
        # The session's window: the offline model takes it as its own (the API knows it).
        model = model.model_copy(update={"context_window": data.ask.window.context_window,
                                         "fallback_model": fallback_model(data.ask.agent,
                                                                          model.fallback_model)})
        assert self.ctx.settings.database_url  # the connection came from it
        streamed: list[str] = []
        async with watcher(self.ctx.settings.database_url).watch(
                conn, data.session_id, data.reply_seq) as stop:
            if not self.ctx.settings.model.stream:
                message = await stop_on_interrupt(
                    lambda: with_heartbeat(self.ctx.model.create(model, request)), stop)
                return message, None, ""
            deltas = DeltaPublisher.for_activity(data.session_id, data.turn, data.reply_seq)

            def on_text(text: str) -> None:
                streamed.append(text)
                deltas.add(text)
            async with deltas:  # closed on the way out, whatever happens (finish() first)
                message = await stop_on_interrupt(
                    lambda: with_heartbeat(self.ctx.model.stream(model, request, on_text)),
                    stop)
                return message, await deltas.finish(), "".join(streamed)

    @activity.defn
    async def run_tool(self, data: ToolInput) -> ToolOutcome:
        # Heartbeats: a worker that dies mid-call is seen in seconds (TOOL_CALL's heartbeat
        # timeout), where its start-to-close held the turn a minute.
        return await with_heartbeat(self._run_tool(data))

    async def _run_tool(self, data: ToolInput) -> ToolOutcome:
        async with await self.ctx.connection() as conn:
            input_id = f"result-{data.tool_use_id}"
            existing = await (await conn.execute(
                "SELECT seq, token_count, content, content_text FROM messages"
                " WHERE session_id=%s AND input_id=%s AND rewound_by IS NULL",
                (data.session_id, input_id))).fetchone()
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
                output = await memory_tool(self.ctx, conn, MemoryCall(
                    session_id=data.session_id, tool_use_id=data.tool_use_id,
                    scope=data.memory_scope, live_from_seq=data.live_from_seq),
                    call["name"], call.get("input") or {})
            else:
                output = await execute_tool(ctx, call["name"], call.get("input") or {})
            text, replaced = make_storable(output.text)
            if replaced:
                text += f"\n[Keel: {'; '.join(replaced)}]"
            shown, said = await stored_files(self.ctx.store, data.session_id,
                                             output.meta.pop("images", []))
            text = "\n".join(part for part in (text, *said) if part)
            content, meta_replaced = make_storable_json(
                {"tool_use_id": data.tool_use_id, "is_error": output.is_error,
                 "tool": call["name"], **output.meta})
            if replaced or meta_replaced:
                content["notes"] = replaced + meta_replaced
            if shown:  # an image or a PDF read_file shows the model
                content["attachments"] = shown
            inserted = await insert_row(conn, NewRow(
                session_id=data.session_id, seq=data.result_seq, input_id=input_id,
                type=MessageType.TOOL_RESULT, text=text, turn=data.turn, content=content,
                extra_tokens=sum(item["tokens"] for item in shown)))
            return ToolOutcome(seq=inserted.seq, token_count=inserted.token_count,
                               is_error=output.is_error,
                               preview=cut(output.text, SHORT_OUTPUT_CHARS))

    @activity.defn
    async def read_reply(self, data: ReadReplyInput) -> ReplyPart:
        """A part of a reply's text, for a caller whose outcome carried only its start."""
        async with await self.ctx.connection() as conn:
            return await reply_part(conn, data.session_id, data.seq, data.start)

    @activity.defn
    @beating
    async def record_tool_result(self, data: ToolResultInput) -> ToolOutcome:
        """Record a result made elsewhere (service tool, MCP, refusal); idempotent by the
        call's id. A result over its cap is cut, and the line says so; one that came by
        reference is read here, and kept whole first (activities.results)."""
        input_id = f"result-{data.tool_use_id}"
        async with await self.ctx.connection() as conn:
            if data.ref is not None and (done := await _recorded(conn, data.session_id,
                                                                 input_id)):
                return done  # a retry: the reference was read and recorded
            text, is_error, meta = data.text, data.is_error, dict(data.meta)
            cap, given = data.cap, data.files
            if data.ref is not None:  # read, and cut already (the line says where)
                text, is_error, meta, given = await self._by_reference(data)
                cap = max(cap, len(text))
            text, cut = cut_result(text, cap,
                                   "ask the tool for a smaller part if you need the rest")
            text, replaced = make_storable(text)
            if replaced:
                meta["notes"] = replaced
            kept, unkept = await keep_files(self.ctx.store, data.session_id,
                                            data.tool_use_id, given)
            files, said = await stored_files(self.ctx.store, data.session_id,
                                             [str(p) for p in meta.pop("images", [])] + kept)
            text = "\n".join(part for part in (text, *unkept, *said) if part)
            if files:
                meta["attachments"] = files
            inserted = await insert_row(conn, NewRow(
                session_id=data.session_id, seq=data.result_seq, input_id=input_id,
                type=MessageType.TOOL_RESULT, text=text, turn=data.turn,
                content={"tool_use_id": data.tool_use_id, "is_error": is_error,
                         "tool": data.tool, "cut": cut or bool(meta.get("cut")), **meta},
                extra_tokens=sum(item["tokens"] for item in files)))
        return ToolOutcome(seq=inserted.seq, token_count=inserted.token_count,
                           is_error=is_error, preview=cut_preview(text, SHORT_OUTPUT_CHARS))

    async def _by_reference(self, data: ToolResultInput
                            ) -> tuple[str, bool, dict[str, Any], list[dict[str, str]]]:
        """The text of a result kept by reference, cut to its cap with the whole kept in the
        workspace (or an error result saying why it could not be read), and its files."""
        assert data.ref is not None
        store = self.ctx.store
        meta: dict[str, Any] = {**data.meta, "by_reference": data.ref.get("size")}
        try:
            payload = await read_payload(store, data.ref)
            value = _payload_value(payload)
        except ValueError as err:
            return f"{data.tool} failed: its result could not be read ({err})", True, meta, []
        text, is_error = result_text(value)
        files = result_files(value)
        if len(text) <= data.cap:
            return text, is_error, meta, files
        try:
            where = await keep_whole(store, data.session_id, data.tool_use_id, text)
        except StoreError as err:
            where = f"the rest could not be kept ({err})"
        else:
            meta["whole_result"] = where
        return cut_result(text, data.cap, where)[0], is_error, {**meta, "cut": True}, files


async def _recorded(conn: AsyncConnection, session_id: str, input_id: str) -> ToolOutcome | None:
    """The outcome of a tool result already recorded under `input_id`, or None."""
    row = await (await conn.execute(
        "SELECT seq, token_count, content, content_text FROM messages WHERE session_id=%s"
        " AND input_id=%s AND rewound_by IS NULL", (session_id, input_id))).fetchone()
    if row is None:
        return None
    return ToolOutcome(seq=row[0], token_count=row[1],
                       is_error=bool((row[2] or {}).get("is_error")),
                       preview=cut_preview(row[3] or "", SHORT_OUTPUT_CHARS))


def _payload_value(payload: Payload) -> Any:
    """A kept result's value: its JSON, or None; ValueError for any other encoding."""
    encoding = payload.metadata.get("encoding", b"").decode(errors="replace")
    if encoding == "binary/null":
        return None
    if encoding != "json/plain":
        raise ValueError(f"its encoding is {encoding or 'missing'}, not json/plain")
    return json.loads(payload.data)


async def _delegation(store: WorkspaceStore, data: ModelCallInput, reply: ModelReply,
                      result: ModelCallResult) -> ModelCallResult:
    """The call's part in delegation, once its reply is in the record (a child's final
    one: its files go home with its answer)."""
    step = data.delegation
    if step is not None:
        result.started_ahead = await start_ahead(step.ahead, data.ask.agent, reply)
        result.told_parent = await tell_parent(data.session_id, step.tell, reply, store)
    return result
