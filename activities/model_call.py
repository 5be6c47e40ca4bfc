"""The model call's payloads and steps: record first, recall, load the window and the
scope, size the request (estimate, pre-pass, cut the newest output), build it, ask, and
insert the reply. `SessionActivities.call_model` chains them.

The record step writes a message asked while the session was idle to the record
(idempotent by its seq and input id) in at most RECORD_STEP_S; when it cannot, it fails as
INPUT_NOT_RECORDED before anything else, and the session's ordinary record takes over. The
recall step searches long memory (a read of the index, at most RECALL_STEP_S); a failure is
returned, and the turn goes on without. The scope step mirrors the session's memory scope
on its row, from which every system prompt takes its core memory.

What the reply step inserts is storable by construction: the model's text and tool input
have their NULs and lone surrogates replaced (`schemas.text.make_storable`) and the row's
`replaced` says so, so bad data never turns into a retry loop.

A call also does its part in delegation (`DelegationStep`, activities.delegate_ahead): a
parent's call starts the child of its reply's waiting `delegate` call, a child's task
turn's final call tells its parent the answer; the result says what it did.

`ModelCallInput` travels through Temporal: it is grouped (the window span, the model asked,
the room steps taken, long memory, the record step) and still decodes from the flat shape
older code wrote and the workflow builds (`ModelCallInput(session_id=..., recall=...)`).
"""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from anthropic.types import Message
from psycopg import AsyncConnection, AsyncCursor
from pydantic import BaseModel, Field, model_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.attachments import with_attachments
from activities.context import SessionContext
from activities.model.usage import usage_of
from activities.record import (
    Inserted,
    NewRow,
    RecordInput,
    ensure_session,
    insert_row,
    send_insert,
    taken_tool_ids,
)
from activities.results import cut_input
from activities.vault.outbox import QueuedTranscript, queue_transcript
from activities.vault.search import recall
from activities.window import LoadedWindow, PendingRows, window_rows
from activities.workspace import PromptFiles
from schemas.agent import AgentSpec
from schemas.checkpoint.policy import Fit, ModelWindow, fit
from schemas.checkpoint.prepass import prepass
from schemas.config import vault_queue
from schemas.context import estimate_tokens, fit_newest_tool_output
from schemas.delegation import DelegateAhead, TellParent
from schemas.events import SHORT_INPUT_CHARS, DeltaTail, cut
from schemas.input_size import LargestPart
from schemas.interrupt import INTERRUPTED_MARK, interrupted_text
from schemas.mcp import McpTool
from schemas.messages import (
    NOT_SENT,
    MessageType,
    ModelReply,
    RecordRow,
    ToolCall,
    Usage,
    inline_reply,
)
from schemas.model import TooLong
from schemas.text import make_storable, make_storable_json
from schemas.tokens import count_tokens
from schemas.tools import unique_tool_ids
from schemas.vault.recall import RecallInput, RecallResult, scrub_memory_echo
from schemas.vault.scope import DEFAULT_SCOPE

__all__ = [
    "INPUT_NOT_RECORDED", "RECALL_STEP_S", "RECORD_STEP_S", "FirstSteps", "LoadedRequest",
    "MemoryStep", "ModelAsk", "ModelCallInput", "ModelCallResult", "RecordStep",
    "RoomSteps", "SizedRequest", "WindowReads", "WindowSpan", "build_request",
    "fixed_tokens", "insert_interrupted", "insert_reply", "largest_part",
    "queue_reply_transcript", "read_window", "recall_step", "record_and_read", "refusal",
    "reply_from_row", "retried_elsewhere", "send_window_reads", "size_request",
    "transcribes",
]

# The model call's record step failed: nothing else was done (the workflow records the
# input the ordinary way, with its own retries and deadline).
INPUT_NOT_RECORDED = "InputNotRecorded"
RECORD_STEP_S = 5.0  # the record step of a model call at most (connection included)
RECALL_STEP_S = 5.0  # the recall step: past it the turn goes on without long memory


class WindowSpan(BaseModel):
    """The rows the request is built over."""

    start_seq: int
    upto_seq: int
    checkpoint_id: str | None = None
    keep_recent_seq: int = 0  # the pre-pass leaves rows from here on as they are


class ModelAsk(BaseModel):
    """The model asked, its sizes, and the session's agent and listed MCP tools."""

    model: str
    window: ModelWindow  # the threshold and the hard limit come from here
    usage_ratio: float = 1.0  # the API's count over Keel's estimate, from the last call
    agent: AgentSpec | None = None  # instructions, tools, provider
    mcp_tools: list[McpTool] = Field(default_factory=list)
    cache_ttl: str = "5m"  # the lifetime of the request's cache entries (schemas.cache_ttl)

    @property
    def instructions(self) -> str:
        return self.agent.instructions if self.agent else ""


class RoomSteps(BaseModel):
    """The room-making ladder as walked for this request already."""

    # Past the threshold (but under the hard limit) it is sent as it is
    # (schemas.checkpoint.policy).
    asked: bool = False
    cut_newest_output: bool = False


class MemoryStep(BaseModel):
    """Long memory: the session's scope (None: none), and this turn's recall."""

    scope: str | None = DEFAULT_SCOPE
    block: str = ""  # this turn's fenced long-memory recall, when already searched
    recall: RecallInput | None = None  # the search to run (its block then replaces `block`)
    # The inputs this call answers, for the daily transcript: queued with the reply, in its
    # transaction (activities.vault.outbox). None: the session appends the transcript
    # itself after the turn (older code).
    transcribe: list[int] | None = None


class RecordStep(BaseModel):
    """A turn's first call: the inputs to write to the record before anything else (a
    message asked while the session was idle)."""

    inputs: list[RecordInput] = Field(default_factory=list)
    within_s: float = RECORD_STEP_S  # past this, INPUT_NOT_RECORDED


# The flat shape's keys, and where each lives now: (group, field).
_FLAT_KEYS: dict[str, tuple[str, str]] = {
    "window_start_seq": ("span", "start_seq"), "upto_seq": ("span", "upto_seq"),
    "checkpoint_id": ("span", "checkpoint_id"), "keep_recent_seq": ("span", "keep_recent_seq"),
    "model": ("ask", "model"), "window": ("ask", "window"),
    "usage_ratio": ("ask", "usage_ratio"), "agent": ("ask", "agent"),
    "mcp_tools": ("ask", "mcp_tools"),
    "room_asked": ("room", "asked"), "cut_newest_output": ("room", "cut_newest_output"),
    "memory_scope": ("memory", "scope"), "memory_block": ("memory", "block"),
    "recall": ("memory", "recall"),
    "record": ("first", "inputs"), "record_within_s": ("first", "within_s"),
}


class DelegationStep(BaseModel):
    """A model call's part in delegation (activities.delegate_ahead): a parent's call may
    start its reply's child itself, a child's task turn's final call tells its parent."""

    ahead: DelegateAhead | None = None
    tell: TellParent | None = None


class ModelCallInput(BaseModel):
    session_id: str
    turn: int
    reply_seq: int
    span: WindowSpan
    ask: ModelAsk
    room: RoomSteps = Field(default_factory=RoomSteps)
    memory: MemoryStep = Field(default_factory=MemoryStep)
    first: RecordStep = Field(default_factory=RecordStep)
    delegation: DelegationStep | None = None

    @model_validator(mode="before")
    @classmethod
    def _lift_flat_keys(cls, data: Any) -> Any:
        """The flat shape (older payloads, keyword construction) lifted into the groups."""
        if not isinstance(data, dict) or not any(k in data for k in _FLAT_KEYS):
            return data
        lifted: dict[str, Any] = {k: v for k, v in data.items() if k not in _FLAT_KEYS}
        for key, (group, name) in _FLAT_KEYS.items():
            if key in data:
                lifted.setdefault(group, {})[name] = data[key]
        return lifted


class ModelCallResult(BaseModel):
    # None: not sent (the session must make room first, or a recorded input turned out to
    # be a caller's retry of one recorded earlier: `recorded` says so)
    reply: ModelReply | None = None
    fit: Fit = Fit.FITS
    estimated_tokens: int = 0
    output_cut: bool = False
    notes: list[str] = Field(default_factory=list)
    # What of the model's output PostgreSQL could not hold and was replaced (the session
    # records a notice saying so).
    replaced: list[str] = Field(default_factory=list)
    recorded: list[Inserted] = Field(default_factory=list)  # one per `record`, in order
    recall: RecallResult | None = None  # the search asked for, when it answered
    recall_failed: str | None = None  # why the search asked for did not
    stream_tail: DeltaTail | None = None  # the reply's text no delta carried yet
    # The API refused the request as too long: its count, and Keel's estimate of it.
    refused: TooLong | None = None
    # Not sent (or refused): what every request carries of its estimate (`fixed_tokens`),
    # and the largest of its rows (`largest_part`), for the notice if the session stops.
    fixed_tokens: int = 0
    largest: LargestPart | None = None
    # The API (a provider's) refused an hour's cache lifetime; it took the request with
    # the default (schemas.cache_ttl): the session asks for five minutes from now on.
    cache_ttl_refused: bool = False
    # The reply's transcript (the inputs it answers, the reply, the recall's hits) is queued
    # for the vault worker: the session writes none of it.
    transcribed: bool = False
    # The reply's calls whose child this call started (call id -> the child's session).
    started_ahead: dict[str, str] = Field(default_factory=dict)
    told_parent: bool = False  # a child's final reply: its parent has the answer


# ----- record first, recall ---------------------------------------------------------------

async def record_and_read(ctx: SessionContext, data: ModelCallInput, stack: AsyncExitStack,
                          ) -> tuple[AsyncConnection, list[Inserted], WindowReads]:
    """The call's connection (entered into `stack`, held to the end of the call), the
    record step of a turn's first model call (every input written on it, or
    INPUT_NOT_RECORDED, non-retryable, when the record does not answer in time, the
    connection's checkout included) and the window's reads: sent behind the last input's
    insert, in its pipeline, so that they see it and one round trip serves both."""
    inputs = data.first.inputs
    if not inputs:
        conn = await stack.enter_async_context(await ctx.connection())
        return conn, [], await read_window(conn, data)
    if any(row.cut_over for row in inputs):  # a folded background input over the limits
        inputs = [await cut_input(ctx.store, row) for row in inputs]
    if any(row.attachments for row in inputs):  # (a message with files is not folded)
        inputs = [await with_attachments(ctx.store, row) for row in inputs]
    try:
        async with asyncio.timeout(min(data.first.within_s, RECORD_STEP_S)):
            conn = await stack.enter_async_context(await ctx.connection())
            async with conn.pipeline():
                # The session's row goes with the first insert.
                await ensure_session(conn, inputs[0].session_id, inputs[0].user_name)
                recorded = [await insert_row(conn, row) for row in inputs[:-1]]
                last = await send_insert(conn, inputs[-1])
                reads = await send_window_reads(conn, data)
                recorded.append(await last.result())
    except ApplicationError:
        raise
    except Exception as err:  # down, refused, timed out, a constraint: not recorded
        reason = ("no answer in time" if isinstance(err, TimeoutError)
                  else f"{type(err).__name__}: {err}")
        raise ApplicationError(f"the record did not take the input: {reason}",
                               type=INPUT_NOT_RECORDED, non_retryable=True) from err
    return conn, recorded, await reads.fetch()


def retried_elsewhere(step: RecordStep, recorded: list[Inserted]) -> bool:
    """A caller's retry of an input recorded earlier: that one is answered there."""
    return any(i.duplicate and i.seq != r.seq
               for i, r in zip(recorded, step.inputs, strict=True))


@dataclass
class FirstSteps:
    """What the record and recall steps learned: returned with every result."""

    recorded: list[Inserted]
    recall: RecallResult | None = None
    recall_failed: str | None = None
    cache_ttl_refused: bool = False  # the API took the request only without the hour

    def result(self, *, reply: ModelReply | None = None, size: Fit = Fit.FITS,
               estimated_tokens: int = 0, output_cut: bool = False,
               notes: list[str] | None = None, replaced: list[str] | None = None,
               stream_tail: DeltaTail | None = None,
               refused: TooLong | None = None, transcribed: bool = False,
               fixed_tokens: int = 0, largest: LargestPart | None = None) -> ModelCallResult:
        return ModelCallResult(
            reply=reply, fit=size, estimated_tokens=estimated_tokens, output_cut=output_cut,
            notes=notes or [], replaced=replaced or [], recorded=self.recorded,
            recall=self.recall, recall_failed=self.recall_failed, stream_tail=stream_tail,
            refused=refused, transcribed=transcribed, cache_ttl_refused=self.cache_ttl_refused,
            fixed_tokens=fixed_tokens, largest=largest)

    def not_sent(self, sized: SizedRequest, loaded: LoadedRequest, data: ModelCallInput,
                 refused: TooLong | None = None) -> ModelCallResult:
        """A request too large to send, or refused by the API as too long: its size for the
        ladder, and what takes its room for the notice if the session stops."""
        return self.result(size=Fit.OVER_LIMIT if refused else sized.size,
                           estimated_tokens=sized.estimate, refused=refused,
                           fixed_tokens=fixed_tokens(loaded, data),
                           largest=largest_part(sized.rows, data))


async def recall_step(ctx: SessionContext, memory: MemoryStep) -> FirstSteps:
    """The recall step, on a connection of its own (it runs beside the record step and the
    window's load): the search, or why it failed (never raises but a cancel). The caller
    adds what the record step recorded."""
    recorded: list[Inserted] = []
    inp = memory.recall
    if inp is None:
        return FirstSteps(recorded)
    try:
        async with asyncio.timeout(RECALL_STEP_S), await ctx.connection() as conn:
            scope = ctx.memory().scoped(inp.scope).scope
            return FirstSteps(recorded, await recall(conn, inp, scope=scope,
                                                     embedder=ctx.embedder))
    except TimeoutError:
        return FirstSteps(recorded, recall_failed=f"no answer in {RECALL_STEP_S:g} s")
    except Exception as err:
        return FirstSteps(recorded, recall_failed=f"{type(err).__name__}: {err}"[:300])


# ----- the window, the scope row, the size --------------------------------------------------

@dataclass
class LoadedRequest:
    """What the request is built from: the window, its tools, this turn's recall."""

    window: LoadedWindow
    tools: list[dict[str, Any]]
    memory_block: str = ""


# The session's memory scope written on its row (the workflow holds it fixed; the system
# prompt of every worker takes its core memory from the row), and what the row says now.
_MIRROR_SCOPE = (
    "WITH upd AS (UPDATE sessions SET memory_scope = %(scope)s WHERE session_id = %(id)s"
    " AND memory_scope IS DISTINCT FROM %(scope)s RETURNING memory_scope)"
    " SELECT memory_scope FROM upd UNION ALL SELECT memory_scope FROM sessions"
    " WHERE session_id = %(id)s AND NOT EXISTS (SELECT 1 FROM upd)")


@dataclass
class WindowReads:
    """What one round trip reads before a request is built."""

    scope: str | None  # as the session's row says it now
    rows: list[RecordRow]  # the window's, the checkpoint's carried ones first
    checkpoint_text: str | None
    reply: RecordRow | None  # the reply already recorded at the call's seq (a retry)


async def read_window(conn: AsyncConnection, data: ModelCallInput) -> WindowReads:
    """The scope mirrored, the checkpoint's text, the window's rows and the reply's seq
    (a retry finds its reply recorded), in one pipeline: one round trip."""
    async with conn.pipeline():
        return await (await send_window_reads(conn, data)).fetch()


class SentReads:
    """The window's reads sent (in a pipeline); `fetch()` takes their answers."""

    def __init__(self, data: ModelCallInput, scope: AsyncCursor[Any],
                 checkpoint: AsyncCursor[Any] | None, rows: PendingRows) -> None:
        self._data, self._scope, self._checkpoint, self._rows = data, scope, checkpoint, rows

    async def fetch(self) -> WindowReads:
        span, reply_seq = self._data.span, self._data.reply_seq
        found_scope = await self._scope.fetchone()
        found = await self._checkpoint.fetchone() if self._checkpoint is not None else None
        loaded = await self._rows.fetch()
        if self._checkpoint is not None and found is None:
            raise ApplicationError(f"checkpoint {span.checkpoint_id} missing",
                                   non_retryable=True)
        return WindowReads(scope=found_scope[0] if found_scope else None,
                           rows=[r for r in loaded if r.seq != reply_seq],
                           checkpoint_text=found[0] if found else None,
                           reply=next((r for r in loaded if r.seq == reply_seq), None))


async def send_window_reads(conn: AsyncConnection, data: ModelCallInput) -> SentReads:
    """`read_window`'s statements, sent (in the caller's pipeline), not read yet."""
    sid, span = data.session_id, data.span
    scope = await conn.execute(_MIRROR_SCOPE, {"scope": data.memory.scope, "id": sid})
    checkpoint = await conn.execute(
        "SELECT rendered FROM checkpoints WHERE checkpoint_id = %s",
        (span.checkpoint_id,)) if span.checkpoint_id else None
    rows = await window_rows(conn, sid, span.start_seq, span.upto_seq,
                             span.checkpoint_id, data.reply_seq)
    return SentReads(data, scope, checkpoint, rows)


async def build_request(ctx: SessionContext, data: ModelCallInput, reads: WindowReads,
                        files: PromptFiles) -> LoadedRequest:
    """The system prompt and the session's tools over what was read."""
    sid = data.session_id
    ctx.prompt.remember_scope(sid, reads.scope)
    window = LoadedWindow(
        system=await ctx.prompt.system_prompt(sid, data.ask.instructions, files,
                                              data.ask.window.hard_limit),
        rows=reads.rows, checkpoint_text=reads.checkpoint_text)
    tools = await ctx.prompt.tools(data.memory.scope, data.ask.agent, data.ask.mcp_tools,
                                   files)
    return LoadedRequest(window=window, tools=tools)


@dataclass
class SizedRequest:
    """The rows to send, their estimate and fit, and what was done to make them fit."""

    rows: list[RecordRow]
    estimate: int
    size: Fit
    output_cut: bool = False
    notes: list[str] = field(default_factory=list)


def _scaled(raw: int, ratio: float) -> int:
    """Keel's count of a part of a request, scaled by the API's count learned so far."""
    return int(raw * max(ratio, 0.5))


def _estimate(loaded: LoadedRequest, rows: list[RecordRow], ratio: float) -> int:
    window = loaded.window
    raw = estimate_tokens(window.system, rows,
                          [window.checkpoint_text or "", loaded.memory_block],
                          tools=loaded.tools)
    return _scaled(raw, ratio)


def fixed_tokens(loaded: LoadedRequest, data: ModelCallInput) -> int:
    """What every request of the session carries, estimated as `_estimate` does: Keel's
    system prompt (instructions, AGENTS.md files, core memory) and the tool definitions.
    Said when a request cannot be sent, so a stop can name what takes the room."""
    raw = estimate_tokens(loaded.window.system, [], [], tools=loaded.tools)
    return _scaled(raw, data.ask.usage_ratio)


def largest_part(rows: list[RecordRow], data: ModelCallInput) -> LargestPart | None:
    """The row of `rows` that takes the most of a request, estimated as `_estimate` does."""
    sent = [r for r in rows if r.type not in NOT_SENT]
    if not sent:
        return None
    row = max(sent, key=lambda r: r.token_count)
    return LargestPart(seq=row.seq, type=row.type,
                       tokens=_scaled(row.token_count, data.ask.usage_ratio))


def size_request(loaded: LoadedRequest, data: ModelCallInput) -> SizedRequest:
    """The estimate; over the threshold, the ladder's first step, the cheap pre-pass (old
    tool outputs shrunk, duplicates pointed at, stale images dropped: often room enough on
    its own); over the hard limit, when asked, the newest tool output cut."""
    ratio, limits = data.ask.usage_ratio, data.ask.window
    rows = loaded.window.rows
    estimate = _estimate(loaded, rows, ratio)
    notes: list[str] = []
    if fit(estimate, limits) is not Fit.FITS:
        shrunk = prepass(rows, keep_recent_seq=data.span.keep_recent_seq)
        if shrunk.tokens_saved:
            rows = shrunk.rows
            estimate = _estimate(loaded, rows, ratio)
            notes.append(f"pre-pass saved {shrunk.tokens_saved} tokens")
    output_cut = False
    if data.room.cut_newest_output and fit(estimate, limits) is Fit.OVER_LIMIT:
        excess = estimate - limits.hard_limit
        excess = int(excess / max(ratio, 0.1)) + 1
        rows, output_cut = fit_newest_tool_output(rows, excess)
        estimate = _estimate(loaded, rows, ratio)
    return SizedRequest(rows=rows, estimate=estimate, size=fit(estimate, limits),
                        output_cut=output_cut, notes=notes)


# ----- the reply ---------------------------------------------------------------------------

def refusal(err: ApplicationError, estimate: int) -> TooLong:
    """A too-long refusal (`PROMPT_TOO_LONG`: its details are the API's count and maximum)
    as the result carries it, with Keel's estimate of the refused request."""
    details = list(err.details or ())
    return TooLong(prompt_tokens=details[0] if details else None,
                   maximum=details[1] if len(details) > 1 else None, estimate=estimate)


def _reply_blocks(message: Message) -> tuple[list[dict[str, Any]], list[str]]:
    """The reply's text and tool-use blocks, recalled memory scrubbed from the text; what
    PostgreSQL cannot hold (a NUL, a lone surrogate) replaced, and said so, so the model
    sees what happened next time."""
    blocks = [b.model_dump(mode="json", exclude_none=True) for b in message.content]
    blocks = [b for b in blocks if b.get("type") in ("text", "tool_use")]
    for b in blocks:
        if b["type"] == "text":
            b["text"] = scrub_memory_echo(b["text"])
    storable, replaced = make_storable_json(blocks)
    return storable, replaced


async def insert_reply(conn: AsyncConnection, data: ModelCallInput,
                       message: Message) -> tuple[ModelReply, list[str]]:
    """The reply inserted at its seq (once), and what of it was replaced. Its tool calls
    carry ids no live call of the session has (schemas.tools.unique_tool_ids: one indexed
    look-up, for a reply that calls tools)."""
    blocks, replaced = _reply_blocks(message)
    if any(b["type"] == "tool_use" for b in blocks):
        taken = await taken_tool_ids(conn, data.session_id, blocks)
        for note in unique_tool_ids(blocks, taken, data.reply_seq):
            activity.logger.warning("reply #%s: %s", data.reply_seq, note)
    text = "\n".join(b["text"] for b in blocks if b["type"] == "text")
    tool_text = " ".join(json.dumps(b.get("input", {})) for b in blocks
                         if b["type"] == "tool_use")
    inserted = await insert_row(conn, NewRow(
        session_id=data.session_id, seq=data.reply_seq,
        input_id=f"reply-{data.reply_seq}", type=MessageType.ASSISTANT, text=text,
        content=blocks, turn=data.turn, token_text=make_storable(f"{text} {tool_text}")[0]))
    reply = ModelReply(
        seq=data.reply_seq, stop_reason=message.stop_reason,
        tool_calls=[ToolCall(id=b["id"], name=b["name"], input_preview=_preview(b.get("input")),
                             input=b.get("input") or {})
                    for b in blocks if b["type"] == "tool_use"],
        usage=usage_of(message), text=inline_reply(text), text_chars=len(text),
        reply_tokens=inserted.token_count, model=message.model)
    return reply, replaced


async def insert_interrupted(conn: AsyncConnection, data: ModelCallInput, partial: str,
                             estimate: int) -> ModelReply:
    """A reply a new message interrupted: what streamed, marked so, inserted at its seq
    (once). Its usage is estimated (the API reports none for a stream cut off): the
    request's estimate in, the text's tokens out. Tool calls that had begun to stream are
    dropped: none of them was run."""
    text = interrupted_text(make_storable(scrub_memory_echo(partial))[0])
    inserted = await insert_row(conn, NewRow(
        session_id=data.session_id, seq=data.reply_seq, input_id=f"reply-{data.reply_seq}",
        type=MessageType.ASSISTANT, text=text, content=[{"type": "text", "text": text}],
        turn=data.turn))
    return ModelReply(
        seq=data.reply_seq, stop_reason="interrupted", text=text,
        usage=Usage(input_tokens=estimate if partial else 0,
                    output_tokens=count_tokens(partial) if partial else 0),
        reply_tokens=inserted.token_count, model=data.ask.model, interrupted=True)


def transcribes(data: ModelCallInput) -> bool:
    """Whether this call queues its reply's transcript (`MemoryStep.transcribe`)."""
    return data.memory.transcribe is not None and data.memory.scope is not None


async def queue_reply_transcript(conn: AsyncConnection, data: ModelCallInput,
                                 reply: ModelReply, found: RecallResult | None) -> bool:
    """The reply's share of the daily transcript, queued for the vault worker in the
    caller's transaction (the one that inserts the reply): the inputs it answers, the reply
    when it has text, the recall's hits. False: the session appends it itself."""
    memory = data.memory
    if not transcribes(data):
        return False
    assert memory.transcribe is not None and memory.scope is not None
    seqs = [*memory.transcribe, *([reply.seq] if reply.text.strip() else [])]
    await queue_transcript(conn, vault_queue(activity.info().task_queue), QueuedTranscript(
        session_id=data.session_id, scope=memory.scope, reply_seq=reply.seq, seqs=seqs,
        recalled=found.sources if found is not None else []))
    return True


def _preview(value: Any) -> str:
    """A tool call's input as compact JSON, cut for an event."""
    return cut(json.dumps(value or {}, separators=(",", ":"), ensure_ascii=False,
                          default=str), SHORT_INPUT_CHARS)


def reply_from_row(row: RecordRow, model: str) -> ModelReply:
    """The reply of a retry that finds it recorded: the model is not asked again."""
    blocks = row.content if isinstance(row.content, list) else []
    calls = [ToolCall(id=b["id"], name=b["name"], input=b.get("input") or {})
             for b in blocks if b.get("type") == "tool_use"]
    interrupted = row.text.endswith(INTERRUPTED_MARK)
    return ModelReply(seq=row.seq, stop_reason="tool_use" if calls else (
                          "interrupted" if interrupted else "end_turn"),
                      tool_calls=calls, text=inline_reply(row.text), text_chars=len(row.text),
                      reply_tokens=row.token_count, model=model, interrupted=interrupted)
