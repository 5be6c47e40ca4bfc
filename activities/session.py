"""The session's activities: record an input, one model call, one tool call.

Each takes ids and sequence numbers, loads what it needs from the record, and returns a
small result. Each is idempotent: a retry after a crash finds its row and returns it.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection
from pydantic import BaseModel, Field, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.db import get_pool
from activities.model import create_message, with_heartbeat
from activities.record import Inserted, NewRow, ensure_session, insert_row, load_rows, load_seqs
from activities.tools import ToolContext, ToolOutput, execute_tool, skill_catalog
from activities.vault.search import search, touch_documents
from activities.vault.store import MemoryContext, VaultError, read_core_text
from schemas.agent import AgentSpec, cut_result, session_tools
from schemas.checkpoint.policy import Fit, ModelWindow, fit, sendable
from schemas.checkpoint.prepass import prepass
from schemas.config import KeelSettings
from schemas.context import (
    SkillEntry,
    SystemPromptParts,
    WorkspaceDoc,
    assemble_messages,
    build_system_prompt,
    estimate_tokens,
    fit_newest_tool_output,
)
from schemas.mcp import McpTool
from schemas.messages import MessageType, ModelReply, RecordRow, ToolCall, Usage
from schemas.tools import AGENT_TOOLS, MEMORY_SEARCH_TOOL, MEMORY_TOOLS
from schemas.vault.card import CardFact
from schemas.vault.recall import fence_memory, scrub_memory_echo
from schemas.vault.rollup import write_card_tool

PACKAGED_SKILLS = Path(__file__).resolve().parent.parent / "keel" / "skills"
OFFLINE_NOTICE = (
    "Keel runs on its offline deterministic model: no network, replies written by rule."
)


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
    memory_block: str = ""  # this turn's fenced long-memory recall
    keep_recent_seq: int = 0  # the pre-pass leaves rows from here on as they are
    # The session's agent (instructions, tools, provider) and its listed MCP tools.
    agent: AgentSpec | None = None
    mcp_tools: list[McpTool] = Field(default_factory=list)


class ModelCallResult(BaseModel):
    reply: ModelReply | None = None  # None: not sent, the session must make room first
    fit: Fit = Fit.FITS
    estimated_tokens: int = 0
    output_cut: bool = False
    notes: list[str] = Field(default_factory=list)


class ToolInput(BaseModel):
    session_id: str
    turn: int
    assistant_seq: int
    tool_use_id: str
    result_seq: int
    upto_seq: int


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


class LoadedWindow(BaseModel):
    system: str
    rows: list[RecordRow]
    checkpoint_text: str | None = None


class SessionActivities:
    """Activities bound to one process's settings (database, model, folders)."""

    def __init__(self, settings: KeelSettings) -> None:
        self.settings = settings
        self._memory: MemoryContext | None = None
        self._vault_ready = False

    def memory(self) -> MemoryContext:
        if self._memory is None:
            assert self.settings.database_url
            self._memory = MemoryContext(settings=self.settings,
                                         database_url=self.settings.database_url)
        return self._memory

    def builtin_tools(self) -> list[dict[str, Any]]:
        """Keel's built-in tools; write_card's enums come from the vault's schema.json."""
        tools = [*AGENT_TOOLS, MEMORY_SEARCH_TOOL]
        schema, _ = self.memory().vault.schema()
        if schema is not None:
            tools.append(write_card_tool(schema))
        return tools

    def tools(self, agent: AgentSpec | None = None,
              mcp_tools: list[McpTool] | None = None) -> list[dict[str, Any]]:
        """The session's tools (schemas.agent.session_tools): the one list every request
        of this session carries, the checkpoint turn's included."""
        return session_tools(self.builtin_tools(), agent, mcp_tools or [])

    async def _conn(self) -> Any:
        if not self.settings.database_url:
            raise ApplicationError("DATABASE_URL is not set", non_retryable=True)
        return (await get_pool(self.settings.database_url)).connection()

    def workspace(self, session_id: str) -> Path:
        path = self.settings.workspaces_dir / session_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def skills_dirs(self) -> list[Path]:
        return [self.settings.skills_dir, PACKAGED_SKILLS]

    def system_prompt(self, session_id: str, instructions: str = "") -> str:
        workspace = self.workspace(session_id)
        agents = [
            WorkspaceDoc(path=str(p.relative_to(workspace)), text=p.read_text(errors="replace"))
            for p in sorted(workspace.rglob("AGENTS.md"))
            if ".keel" not in p.relative_to(workspace).parts
        ]
        skills = [SkillEntry(name=n, description=d) for n, d, _ in
                  skill_catalog(self.skills_dirs())]
        return build_system_prompt(SystemPromptParts(
            skills=skills, agents_md=agents, core_memory=self.core_memory(),
            offline_notice=OFFLINE_NOTICE if self.settings.model.offline else "",
            instructions=instructions))

    def core_memory(self) -> str:
        return read_core_text(self.settings)

    async def load_window(self, conn: AsyncConnection, session_id: str, window_start: int,
                          upto: int, checkpoint_id: str | None,
                          instructions: str = "") -> LoadedWindow:
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
        return LoadedWindow(system=self.system_prompt(session_id, instructions), rows=rows,
                            checkpoint_text=checkpoint_text)

    @activity.defn
    async def record_input(self, data: RecordInput) -> Inserted:
        async with await self._conn() as conn:
            await ensure_session(conn, data.session_id, data.user_name)
            return await insert_row(conn, data)

    @activity.defn
    async def call_model(self, data: ModelCallInput) -> ModelCallResult:
        async with await self._conn() as conn:
            done = await load_seqs(conn, data.session_id, [data.reply_seq])
            if done:  # a retry after the reply was recorded: do not ask the model again
                return ModelCallResult(reply=_reply_from_row(done[0], data.model))
            window = await self.load_window(
                conn, data.session_id, data.window_start_seq, data.upto_seq,
                data.checkpoint_id, data.agent.instructions if data.agent else "")
            rows = window.rows
            estimate = self._estimate(window, rows, data.usage_ratio, data.memory_block)
            notes: list[str] = []
            if fit(estimate, data.window) is not Fit.FITS:
                # The ladder's first step, the cheap pre-pass: old tool outputs shrunk,
                # duplicates pointed at, stale images dropped. Often room enough on its own.
                shrunk = prepass(rows, keep_recent_seq=data.keep_recent_seq)
                if shrunk.tokens_saved:
                    rows = shrunk.rows
                    estimate = self._estimate(window, rows, data.usage_ratio, data.memory_block)
                    notes.append(f"pre-pass saved {shrunk.tokens_saved} tokens")
            output_cut = False
            if data.cut_newest_output and fit(estimate, data.window) is Fit.OVER_LIMIT:
                excess = estimate - data.window.hard_limit
                excess = int(excess / max(data.usage_ratio, 0.1)) + 1
                rows, output_cut = fit_newest_tool_output(rows, excess)
                estimate = self._estimate(window, rows, data.usage_ratio, data.memory_block)
            size = fit(estimate, data.window)
            if not sendable(size, room_asked=data.room_asked):
                return ModelCallResult(fit=size, estimated_tokens=estimate)
            if not self._vault_ready:  # once per process: the vault from its template
                await asyncio.to_thread(self.memory().vault.ensure)
                self._vault_ready = True
            messages, assembly_notes = assemble_messages(
                rows, checkpoint_text=window.checkpoint_text,
                memory_block=data.memory_block or None)
            notes += assembly_notes
            request = {
                "model": data.model, "max_tokens": data.window.max_output_tokens,
                "system": window.system, "messages": messages,
                "tools": self.tools(data.agent, data.mcp_tools),
            }
            provider = data.agent.provider if data.agent else None
            try:
                model_settings = self.settings.model_for(provider)
            except KeyError:
                raise ApplicationError(f"provider profile {provider!r} is unknown to this "
                                       "worker", non_retryable=True) from None
            message = await with_heartbeat(create_message(model_settings, request))
            blocks = [b.model_dump(mode="json", exclude_none=True) for b in message.content]
            blocks = [b for b in blocks if b.get("type") in ("text", "tool_use")]
            text = _scrub("\n".join(b["text"] for b in blocks if b["type"] == "text"))
            for b in blocks:
                if b["type"] == "text":
                    b["text"] = _scrub(b["text"])
            tool_text = " ".join(json.dumps(b.get("input", {})) for b in blocks
                                 if b["type"] == "tool_use")
            inserted = await insert_row(conn, NewRow(
                session_id=data.session_id, seq=data.reply_seq,
                input_id=f"reply-{data.reply_seq}", type=MessageType.ASSISTANT, text=text,
                content=blocks, turn=data.turn, token_text=f"{text} {tool_text}"))
            usage = message.usage
            reply = ModelReply(
                seq=data.reply_seq, stop_reason=message.stop_reason,
                tool_calls=[ToolCall(id=b["id"], name=b["name"], input=b.get("input") or {})
                            for b in blocks if b["type"] == "tool_use"],
                usage=Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                            cache_read_input_tokens=usage.cache_read_input_tokens or 0,
                            cache_creation_input_tokens=usage.cache_creation_input_tokens or 0),
                text=text, reply_tokens=inserted.token_count, model=message.model)
            return ModelCallResult(reply=reply, fit=size, estimated_tokens=estimate,
                                   output_cut=output_cut, notes=notes)

    def _estimate(self, window: LoadedWindow, rows: list[RecordRow], ratio: float,
                  memory_block: str = "") -> int:
        raw = estimate_tokens(window.system, rows, [window.checkpoint_text or "", memory_block])
        return int(raw * max(ratio, 0.5))

    @activity.defn
    async def run_tool(self, data: ToolInput) -> ToolOutcome:
        async with await self._conn() as conn:
            input_id = f"result-{data.tool_use_id}"
            existing = await (await conn.execute(
                "SELECT seq, token_count, content FROM messages WHERE session_id=%s"
                " AND input_id=%s", (data.session_id, input_id))).fetchone()
            if existing:
                return ToolOutcome(seq=existing[0], token_count=existing[1],
                                   is_error=bool((existing[2] or {}).get("is_error")))
            assistant = await load_seqs(conn, data.session_id, [data.assistant_seq])
            call = next((b for b in (assistant[0].content or []) if isinstance(b, dict)
                         and b.get("id") == data.tool_use_id), None) if assistant else None
            if call is None:
                raise ApplicationError(f"tool call {data.tool_use_id} not in the record",
                                       non_retryable=True)
            ctx = ToolContext(session_id=data.session_id,
                              workspace=self.workspace(data.session_id),
                              skills_dirs=self.skills_dirs(), conn=conn,
                              upto_seq=data.upto_seq)
            if call["name"] in MEMORY_TOOLS:
                output = await self._memory_tool(conn, data, call["name"],
                                                 call.get("input") or {})
            else:
                output = await execute_tool(ctx, call["name"], call.get("input") or {})
            inserted = await insert_row(conn, NewRow(
                session_id=data.session_id, seq=data.result_seq, input_id=input_id,
                type=MessageType.TOOL_RESULT, text=output.text, turn=data.turn,
                content={"tool_use_id": data.tool_use_id, "is_error": output.is_error,
                         "tool": call["name"], **output.meta}))
            return ToolOutcome(seq=inserted.seq, token_count=inserted.token_count,
                               is_error=output.is_error)

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
        memory = self.memory()
        if name == "memory_search":
            query = str(args.get("query", "")).strip()
            if not query:
                return ToolOutput("query is empty", is_error=True)
            hits = await search(conn, query, k=max(1, min(int(args.get("limit", 5)), 10)),
                                exclude_session=data.session_id)
            await touch_documents(conn, [h.path for h in hits])
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


def _scrub(text: str) -> str:
    return scrub_memory_echo(text)


def _reply_from_row(row: RecordRow, model: str) -> ModelReply:
    blocks = row.content if isinstance(row.content, list) else []
    calls = [ToolCall(id=b["id"], name=b["name"], input=b.get("input") or {})
             for b in blocks if b.get("type") == "tool_use"]
    return ModelReply(seq=row.seq, stop_reason="tool_use" if calls else "end_turn",
                      tool_calls=calls, text=row.text, reply_tokens=row.token_count, model=model)
