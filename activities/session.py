"""The session's activities: record an input, one model call, one tool call.

Each takes ids and sequence numbers, loads what it needs from the record, and returns a
small result. Each is idempotent: a retry after a crash finds its row and returns it.

A plain turn is one activity before its reply: the model call of a message asked while the
session was idle first writes that message to the record (idempotent by its seq and input
id, in at most RECORD_STEP_S; when it cannot, it fails as INPUT_NOT_RECORDED before anything
else, and the session's ordinary record takes over), then searches long memory (a read of
the index, at most RECALL_STEP_S; a failure is returned, and the turn goes on without),
then rebuilds the window from the record and asks the model. One task round trip and one
activity per turn fewer than recording, recalling and calling apart.

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
from datetime import datetime
from pathlib import Path
from typing import Any

from anthropic.types import Message
from psycopg import AsyncConnection
from pydantic import BaseModel, Field, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.db import get_pool
from activities.events import DeltaPublisher
from activities.model import create_message, with_heartbeat
from activities.model_stream import stream_message
from activities.record import (
    FenceInput,
    Inserted,
    NewRow,
    ensure_session,
    fence_seq,
    insert_row,
    load_rows,
    load_seqs,
)
from activities.tools import Skill, ToolContext, ToolOutput, execute_tool, load_skills
from activities.vault.search import Embedder, load_embedder, recall, search, touch_documents
from activities.vault.store import TEMPLATE_DIR, MemoryContext, VaultError
from activities.vault_share import shared_vault_text
from activities.workspace import WorkspaceStore, open_store
from schemas.agent import AgentSpec, cut_result, session_tools
from schemas.checkpoint.policy import Fit, ModelWindow, fit, sendable
from schemas.checkpoint.prepass import prepass
from schemas.config import KeelSettings, ModelSettings
from schemas.context import (
    SkillEntry,
    SystemPromptParts,
    WorkspaceDoc,
    assemble_messages,
    build_system_prompt,
    estimate_tokens,
    fit_newest_tool_output,
    with_cache_breakpoints,
)
from schemas.events import SHORT_INPUT_CHARS, SHORT_OUTPUT_CHARS, DeltaTail, cut
from schemas.mcp import McpTool
from schemas.messages import MessageType, ModelReply, RecordRow, ToolCall, Usage
from schemas.text import make_storable, make_storable_json
from schemas.tools import AGENT_TOOLS, MEMORY_SEARCH_TOOL, MEMORY_TOOLS
from schemas.vault.card import CardFact
from schemas.vault.recall import RecallInput, RecallResult, fence_memory, scrub_memory_echo
from schemas.vault.rollup import write_card_tool
from schemas.vault.schema import CORE_FILE, SCHEMA_FILE, SearchMode, parse_schema
from schemas.vault.scope import DEFAULT_SCOPE, tool_scope_problem

PACKAGED_SKILLS = Path(__file__).resolve().parent.parent / "keel" / "skills"
OFFLINE_NOTICE = (
    "Keel runs on its offline deterministic model: no network, replies written by rule."
)
# The model call's record step failed: nothing else was done (the workflow records the
# input the ordinary way, with its own retries and deadline).
INPUT_NOT_RECORDED = "InputNotRecorded"
RECORD_STEP_S = 5.0  # the record step of a model call at most (connection included)
RECALL_STEP_S = 5.0  # the recall step: past it the turn goes on without long memory


class RecordInput(NewRow):
    user_name: str = "user"  # for the session row, written with the first input


class ModelCallInput(BaseModel):
    session_id: str
    turn: int
    reply_seq: int
    window_start_seq: int
    upto_seq: int
    checkpoint_id: str | None = None
    model: str
    window: ModelWindow  # the threshold and the hard limit come from here
    usage_ratio: float = 1.0  # the API's count over Keel's estimate, from the last call
    # The session has walked the room-making ladder for this request already: past the
    # threshold (but under the hard limit) it is sent as it is (schemas.checkpoint.policy).
    room_asked: bool = False
    cut_newest_output: bool = False
    memory_block: str = ""  # this turn's fenced long-memory recall, when already searched
    keep_recent_seq: int = 0  # the pre-pass leaves rows from here on as they are
    memory_scope: str | None = DEFAULT_SCOPE  # the session's; None: no long memory
    # The session's agent (instructions, tools, provider) and its listed MCP tools.
    agent: AgentSpec | None = None
    mcp_tools: list[McpTool] = Field(default_factory=list)
    # A turn's first call: the inputs to write to the record before anything else (a
    # message asked while the session was idle), and the search of long memory to run
    # (its block then takes the place of `memory_block`).
    record: list[RecordInput] = Field(default_factory=list)
    record_within_s: float = RECORD_STEP_S  # past this, INPUT_NOT_RECORDED
    recall: RecallInput | None = None


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


class LoadedWindow(BaseModel):
    system: str
    rows: list[RecordRow]
    checkpoint_text: str | None = None


class SessionActivities:
    """Activities bound to one process's settings (database, model, folders)."""

    def __init__(self, settings: KeelSettings) -> None:
        self.settings = settings
        self._memory: MemoryContext | None = None
        # session id -> scope, as last read from its row (for prompts built without a conn)
        self._scopes: dict[str, str | None] = {}
        self._store: WorkspaceStore | None = None
        memory = settings.memory
        self._embedder: Embedder | None = (
            load_embedder(memory.embedder or "hashing")
            if memory.search_mode == SearchMode.HYBRID else None)

    def memory(self) -> MemoryContext:
        if self._memory is None:
            assert self.settings.database_url
            self._memory = MemoryContext(settings=self.settings,
                                         database_url=self.settings.database_url)
        return self._memory

    async def builtin_tools(self, scope: str | None = DEFAULT_SCOPE) -> list[dict[str, Any]]:
        """Keel's built-in tools; write_card's enums come from the scope's schema.json, as
        the vault worker published it (activities.vault_share): the same on every worker.
        A session without long memory gets no memory tools."""
        if scope is None:
            return list(AGENT_TOOLS)
        tools = [*AGENT_TOOLS, MEMORY_SEARCH_TOOL]
        text = await shared_vault_text(self.store, scope, SCHEMA_FILE)
        if text is None:  # not published yet: a new vault is made from the template's
            text = (TEMPLATE_DIR / SCHEMA_FILE).read_text()
        schema = parse_schema(text)[0]
        if schema is not None:
            tools.append(write_card_tool(schema))
        return tools

    async def tools(self, scope: str | None = DEFAULT_SCOPE, agent: AgentSpec | None = None,
                    mcp_tools: list[McpTool] | None = None) -> list[dict[str, Any]]:
        """The session's tools (schemas.agent.session_tools): the one list every request
        of this session carries, the checkpoint turn's included."""
        return session_tools(await self.builtin_tools(scope), agent, mcp_tools or [])

    async def _conn(self) -> Any:
        if not self.settings.database_url:
            raise ApplicationError("DATABASE_URL is not set", non_retryable=True)
        return (await get_pool(self.settings.database_url)).connection()

    @property
    def store(self) -> WorkspaceStore:
        """The sessions' files (activities.workspace), the same on every worker."""
        if self._store is None:
            self._store = open_store(self.settings)
        return self._store

    async def skills(self) -> list[Skill]:
        return await load_skills(self.store, PACKAGED_SKILLS)

    async def system_prompt(self, session_id: str, instructions: str = "") -> str:
        """The system prompt, with the core memory of the session's scope (as last read
        from its row by load_window; none when not known) and the agent's instructions."""
        # Point reads of the AGENTS.md files the store knows (activities.workspace): never
        # a listing of the workspace, which would grow with its files.
        agents = [WorkspaceDoc(path=path, text=data.decode("utf-8", errors="replace"))
                  for path, data in sorted((await self.store.agents_files(session_id)).items())]
        skills = [SkillEntry(name=s.name, description=s.description)
                  for s in await self.skills()]
        return build_system_prompt(SystemPromptParts(
            skills=skills, agents_md=agents,
            core_memory=await self.core_memory(self._scopes.get(session_id)),
            offline_notice=OFFLINE_NOTICE if self.settings.model.offline else "",
            instructions=instructions))

    async def core_memory(self, scope: str | None = DEFAULT_SCOPE) -> str:
        """The scope's CORE.md as the vault worker published it ("" before it has, and for
        a session without long memory)."""
        if scope is None:
            return ""
        return (await shared_vault_text(self.store, scope, CORE_FILE) or "").strip()

    async def session_tools(self, session_id: str, agent: AgentSpec | None = None,
                            mcp_tools: list[McpTool] | None = None) -> list[dict[str, Any]]:
        """The tools of a session whose window was loaded (its scope known from its row)."""
        return await self.tools(self._scopes.get(session_id), agent, mcp_tools)

    async def session_scope(self, conn: AsyncConnection, session_id: str) -> str | None:
        row = await (await conn.execute(
            "SELECT memory_scope FROM sessions WHERE session_id = %s", (session_id,))
        ).fetchone()
        scope = row[0] if row else None
        self._scopes[session_id] = scope
        return scope

    async def load_window(self, conn: AsyncConnection, session_id: str, window_start: int,
                          upto: int, checkpoint_id: str | None,
                          instructions: str = "") -> LoadedWindow:
        await self.session_scope(conn, session_id)
        checkpoint_text: str | None = None
        carried: list[RecordRow] = []
        if checkpoint_id:
            found = await (await conn.execute(
                "SELECT rendered, carried_seqs FROM checkpoints WHERE checkpoint_id=%s",
                (checkpoint_id,))).fetchone()
            if found is None:
                raise ApplicationError(f"checkpoint {checkpoint_id} missing", non_retryable=True)
            checkpoint_text = found[0]
            carried = await load_seqs(conn, session_id,
                                      [s for s in found[1] if s < window_start])
        rows = carried + await load_rows(conn, session_id, window_start, upto)
        return LoadedWindow(system=await self.system_prompt(session_id, instructions),
                            rows=rows,
                            checkpoint_text=checkpoint_text)

    @activity.defn
    async def record_input(self, data: RecordInput) -> Inserted:
        async with await self._conn() as conn:
            await ensure_session(conn, data.session_id, data.user_name)
            return await insert_row(conn, data)

    @activity.defn
    async def fence_seq(self, data: FenceInput) -> Inserted:
        """The tombstone over a seq the session gave up on (see activities.record)."""
        async with await self._conn() as conn:
            return await fence_seq(conn, data)

    async def _record_first(self, inputs: list[RecordInput],
                            within_s: float) -> list[Inserted]:
        """The record step of a turn's first model call: every input written, or
        INPUT_NOT_RECORDED (non-retryable) when the record does not answer in time."""
        if not inputs:
            return []
        try:
            async with asyncio.timeout(min(within_s, RECORD_STEP_S)), \
                    await self._conn() as conn:
                await ensure_session(conn, inputs[0].session_id, inputs[0].user_name)
                return [await insert_row(conn, row) for row in inputs]
        except ApplicationError:
            raise
        except Exception as err:  # down, refused, timed out, a constraint: not recorded
            reason = ("no answer in time" if isinstance(err, TimeoutError)
                      else f"{type(err).__name__}: {err}")
            raise ApplicationError(f"the record did not take the input: {reason}",
                                   type=INPUT_NOT_RECORDED, non_retryable=True) from err

    async def _recall(self, conn: AsyncConnection,
                      inp: RecallInput | None) -> tuple[RecallResult | None, str | None]:
        """The recall step: the search, or why it failed (never raises but a cancel)."""
        if inp is None:
            return None, None
        try:
            async with asyncio.timeout(RECALL_STEP_S):
                scope = self.memory().scoped(inp.scope).scope
                return await recall(conn, inp, scope=scope, embedder=self._embedder), None
        except TimeoutError:
            return None, f"no answer in {RECALL_STEP_S:g} s"
        except Exception as err:
            return None, f"{type(err).__name__}: {err}"[:300]

    @activity.defn
    async def call_model(self, data: ModelCallInput) -> ModelCallResult:
        recorded = await self._record_first(data.record, data.record_within_s)
        if any(i.duplicate and i.seq != r.seq for i, r in zip(recorded, data.record,
                                                               strict=True)):
            # A caller's retry of an input recorded earlier: that one is answered there.
            return ModelCallResult(recorded=recorded)
        async with await self._conn() as conn:
            found, recall_failed = await self._recall(conn, data.recall)
            memory_block = found.block if found is not None else data.memory_block
            learned = {"recorded": recorded, "recall": found, "recall_failed": recall_failed}
            done = await load_seqs(conn, data.session_id, [data.reply_seq])
            if done:  # a retry after the reply was recorded: do not ask the model again
                return ModelCallResult(reply=_reply_from_row(done[0], data.model), **learned)
            await conn.execute(  # the row mirrors the scope the workflow holds fixed
                "UPDATE sessions SET memory_scope = %s WHERE session_id = %s"
                " AND memory_scope IS DISTINCT FROM %s",
                (data.memory_scope, data.session_id, data.memory_scope))
            window = await self.load_window(
                conn, data.session_id, data.window_start_seq, data.upto_seq,
                data.checkpoint_id, data.agent.instructions if data.agent else "")
            rows = window.rows
            tools = await self.tools(data.memory_scope, data.agent, data.mcp_tools)
            estimate = self._estimate(window, rows, data.usage_ratio, memory_block, tools)
            notes: list[str] = []
            if fit(estimate, data.window) is not Fit.FITS:
                # The ladder's first step, the cheap pre-pass: old tool outputs shrunk,
                # duplicates pointed at, stale images dropped. Often room enough on its own.
                shrunk = prepass(rows, keep_recent_seq=data.keep_recent_seq)
                if shrunk.tokens_saved:
                    rows = shrunk.rows
                    estimate = self._estimate(window, rows, data.usage_ratio,
                                              memory_block, tools)
                    notes.append(f"pre-pass saved {shrunk.tokens_saved} tokens")
            output_cut = False
            if data.cut_newest_output and fit(estimate, data.window) is Fit.OVER_LIMIT:
                excess = estimate - data.window.hard_limit
                excess = int(excess / max(data.usage_ratio, 0.1)) + 1
                rows, output_cut = fit_newest_tool_output(rows, excess)
                estimate = self._estimate(window, rows, data.usage_ratio, memory_block,
                                          tools)
            size = fit(estimate, data.window)
            if not sendable(size, room_asked=data.room_asked):
                return ModelCallResult(fit=size, estimated_tokens=estimate, **learned)
            messages, assembly_notes = assemble_messages(
                rows, checkpoint_text=window.checkpoint_text,
                memory_block=memory_block or None)
            notes += assembly_notes
            system, messages = with_cache_breakpoints(
                window.system, messages, checkpoint_text=window.checkpoint_text,
                volatile_text=memory_block or None)
            request = {
                "model": data.model, "max_tokens": data.window.max_output_tokens,
                "system": system, "messages": messages, "tools": tools,
            }
            provider = data.agent.provider if data.agent else None
            try:
                model_settings = self.settings.model_for(provider)
            except KeyError:
                raise ApplicationError(f"provider profile {provider!r} is unknown to this "
                                       "worker", non_retryable=True) from None
            message, tail = await self._ask_model(data, request, model_settings)
            blocks = [b.model_dump(mode="json", exclude_none=True) for b in message.content]
            blocks = [b for b in blocks if b.get("type") in ("text", "tool_use")]
            for b in blocks:
                if b["type"] == "text":
                    b["text"] = _scrub(b["text"])
            # Model output and tool input PostgreSQL cannot hold (a NUL, a lone surrogate):
            # replaced, and the row says so, so the model sees what happened next time.
            blocks, replaced = make_storable_json(blocks)
            text = "\n".join(b["text"] for b in blocks if b["type"] == "text")
            tool_text = " ".join(json.dumps(b.get("input", {})) for b in blocks
                                 if b["type"] == "tool_use")
            inserted = await insert_row(conn, NewRow(
                session_id=data.session_id, seq=data.reply_seq,
                input_id=f"reply-{data.reply_seq}", type=MessageType.ASSISTANT, text=text,
                content=blocks, turn=data.turn,
                token_text=make_storable(f"{text} {tool_text}")[0]))
            usage = message.usage
            reply = ModelReply(
                seq=data.reply_seq, stop_reason=message.stop_reason,
                tool_calls=[ToolCall(id=b["id"], name=b["name"],
                                     input_preview=_preview(b.get("input")),
                                     input=b.get("input") or {})
                            for b in blocks if b["type"] == "tool_use"],
                usage=Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                            cache_read_input_tokens=usage.cache_read_input_tokens or 0,
                            cache_creation_input_tokens=usage.cache_creation_input_tokens or 0),
                text=text, reply_tokens=inserted.token_count, model=message.model)
            return ModelCallResult(reply=reply, fit=size, estimated_tokens=estimate,
                                   output_cut=output_cut, notes=notes, replaced=replaced,
                                   stream_tail=tail, **learned)

    async def _ask_model(self, data: ModelCallInput, request: dict[str, Any],
                         model: ModelSettings) -> tuple[Message, DeltaTail | None]:
        """The model's reply; its text streamed onto the session's events as it comes, but
        for the end no delta carried yet, returned for the workflow to publish."""
        if not self.settings.model.stream:
            return await with_heartbeat(create_message(model, request)), None
        deltas = DeltaPublisher.for_activity(data.session_id, data.turn, data.reply_seq)
        async with deltas:  # closed on the way out, whatever happens (finish() first)
            message = await with_heartbeat(stream_message(model, request, deltas.add))
            return message, await deltas.finish()

    def _estimate(self, window: LoadedWindow, rows: list[RecordRow], ratio: float,
                  memory_block: str, tools: list[dict[str, Any]]) -> int:
        raw = estimate_tokens(window.system, rows, [window.checkpoint_text or "", memory_block],
                              tools=tools)
        return int(raw * max(ratio, 0.5))

    @activity.defn
    async def run_tool(self, data: ToolInput) -> ToolOutcome:
        async with await self._conn() as conn:
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
            ctx = ToolContext(session_id=data.session_id, store=self.store,
                              skills=await self.skills(), conn=conn, upto_seq=data.upto_seq,
                              op_id=f"tool:{data.tool_use_id}")
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
        async with await self._conn() as conn:
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
        memory = self.memory().scoped(data.memory_scope)
        if name == "memory_search":
            query = str(args.get("query", "")).strip()
            if not query:
                return ToolOutput("query is empty", is_error=True)
            hits = await search(conn, query, scope=memory.scope,
                                k=max(1, min(int(args.get("limit", 5)), 10)),
                                exclude_session=data.session_id)
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


def _preview(value: Any) -> str:
    """A tool call's input as compact JSON, cut for an event."""
    return cut(json.dumps(value or {}, separators=(",", ":"), ensure_ascii=False,
                          default=str), SHORT_INPUT_CHARS)


def _scrub(text: str) -> str:
    return scrub_memory_echo(text)


def _reply_from_row(row: RecordRow, model: str) -> ModelReply:
    blocks = row.content if isinstance(row.content, list) else []
    calls = [ToolCall(id=b["id"], name=b["name"], input=b.get("input") or {})
             for b in blocks if b.get("type") == "tool_use"]
    return ModelReply(seq=row.seq, stop_reason="tool_use" if calls else "end_turn",
                      tool_calls=calls, text=row.text, reply_tokens=row.token_count, model=model)
