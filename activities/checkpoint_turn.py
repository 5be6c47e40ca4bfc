"""The checkpoint turn: one bounded round of it, and the memory flush's request.

The turn's requests carry the same tools, system prompt and (pre-passed) conversation
prefix as the request they interrupt, with cache breakpoints, so they read that prefix
from the prompt cache (`schemas.request.turn_request`); its limits (read files, edit only
the mind and memo files) are enforced on the calls it makes (`CHECKPOINT_REFUSAL`), never
by changing the tools list. A round is recorded with its attempt: a retried round finds
itself and reports again, and each round starts from the files as the last one left them,
restored from the database, so an edit is never applied twice.
"""

from __future__ import annotations

import json
from typing import Any

from anthropic.types import Message
from psycopg import AsyncConnection

from activities import checkpoint_attempts as attempts
from activities.checkpoint_payloads import PrepareInput, RoundInput, RoundResult
from activities.context import SessionContext
from activities.tools import ToolContext, execute_tool
from activities.window import LoadedWindow
from schemas.checkpoint.policy import checkpoint_reply_room
from schemas.checkpoint.prepass import prepass
from schemas.checkpoint.problems import Problem
from schemas.checkpoint.request import (
    FINAL_ROUND_NOTE,
    MEMO_FILE,
    MIND_FILE,
    REQUEST_MARKER,
    checkpoint_instruction,
    repair_request,
)
from schemas.context import assemble_messages, leave_out_output
from schemas.request import append_user, checkpoint_round_messages, turn_request
from schemas.tools import CHECKPOINT_TOOL_NAMES

__all__ = ["CHECKPOINT_REFUSAL", "flush_request", "round_request", "run_round"]

CHECKPOINT_REFUSAL = (
    "{name} refused: during a checkpoint you may only read files (read_file) and edit the "
    "mind and memo files (edit_file)."
)


async def _conversation(ctx: SessionContext, conn: AsyncConnection, attempt: dict[str, Any],
                        meta: PrepareInput) -> tuple[LoadedWindow, list[dict[str, Any]]]:
    """The session's window and conversation as this attempt's turn sees them: the
    prefix every request of the attempt (the memory flush, the rounds) shares."""
    window = await ctx.windows.load(
        conn, meta.session_id, meta.window_start_seq, meta.upto_seq, meta.checkpoint_id,
        meta.instructions)
    rows = prepass(window.rows, keep_recent_seq=meta.turn_first_seq).rows
    if meta.portion < 1.0:
        # Too large for a checkpoint turn: it sees only the part it condenses.
        rows = [r for r in rows if r.seq < attempt["cut_seq"]]
    elif meta.omit_seq is not None:
        rows = leave_out_output(rows, meta.omit_seq)
    messages, _ = assemble_messages(rows, checkpoint_text=window.checkpoint_text)
    return window, messages


def _reply_room(meta: PrepareInput) -> int:
    return checkpoint_reply_room(meta.window.context_window, meta.window.max_output_tokens)


async def flush_request(ctx: SessionContext, attempt_id: str, instruction: str,
                        max_tokens: int) -> dict[str, Any]:
    """The memory flush's request for a prepared attempt: the same tools, system prompt
    and conversation prefix as the checkpoint turn after it (so both read it from the
    prompt cache), then `instruction`."""
    async with await ctx.connection() as conn:
        attempt = await attempts.attempt(conn, attempt_id)
        meta = attempts.meta(attempt)
        window, messages = await _conversation(ctx, conn, attempt, meta)
    conversation_end = len(messages)
    append_user(messages, [{"type": "text", "text": instruction}])
    return turn_request(
        model=meta.model, max_tokens=min(max_tokens, _reply_room(meta)),
        system=window.system, messages=messages, conversation_end=conversation_end,
        checkpoint_text=window.checkpoint_text,
        tools=await ctx.prompt.session_tools(meta.session_id, meta.agent, meta.mcp_tools))


def round_prompt(attempt: dict[str, Any], data: RoundInput) -> str | None:
    """Keel's words before this round: the repair request, or the last-round note."""
    if data.repair:
        problems = [Problem(**p) for p in attempt["problems"]]
        return repair_request(problems, mind_path=attempt["mind_path"],
                              memo_path=attempt["memo_path"])
    return FINAL_ROUND_NOTE if data.final else None


async def round_request(ctx: SessionContext, conn: AsyncConnection, attempt: dict[str, Any],
                        data: RoundInput) -> dict[str, Any]:
    """This round's request: the conversation, Keel's instruction, the rounds so far."""
    meta = attempts.meta(attempt)
    window, conversation = await _conversation(ctx, conn, attempt, meta)
    conversation_end = len(conversation)
    instruction = REQUEST_MARKER + "\n" + checkpoint_instruction(
        mind_path=attempt["mind_path"], memo_path=attempt["memo_path"],
        mind_text=attempt["previous_mind"], checklist_text=attempt["checklist_original"],
        budgets=meta.budgets(), user_name=meta.user_name,
        in_turn_user_seqs=list(attempt["in_turn_user_seqs"]))
    messages = checkpoint_round_messages(conversation, instruction, attempt["rounds"][1:],
                                         round_prompt(attempt, data))
    return turn_request(
        model=meta.model, max_tokens=_reply_room(meta), system=window.system,
        messages=messages, conversation_end=conversation_end,
        checkpoint_text=window.checkpoint_text,
        tools=await ctx.prompt.session_tools(meta.session_id, meta.agent, meta.mcp_tools),
        final=data.final)


async def run_round(ctx: SessionContext, conn: AsyncConnection, attempt: dict[str, Any],
                    data: RoundInput, message: Message) -> RoundResult:
    """The round's reply acted on (its allowed calls run, the others refused) and
    recorded with the files as it left them."""
    blocks = [b.model_dump(mode="json", exclude_none=True) for b in message.content]
    blocks = [b for b in blocks if b.get("type") in ("text", "tool_use")]
    session_id = attempt["session_id"]
    # The files as the previous round left them, from the database: a retried round
    # starts from the same text (edits are never applied twice), on any worker.
    mind_text, memo_text = attempts.files_state(attempt)
    await attempts.write_files(ctx.store, session_id, mind_text, memo_text)
    tools = ToolContext(session_id=session_id, store=ctx.store,
                        skills=await ctx.prompt.skills(), conn=conn,
                        upto_seq=attempt["upto_seq"], editable={MIND_FILE, MEMO_FILE})
    results = []
    for block in blocks:
        if block["type"] != "tool_use":
            continue
        if block["name"] in CHECKPOINT_TOOL_NAMES:
            output = await execute_tool(tools, block["name"], block.get("input") or {})
            content, is_error = output.text, output.is_error
        else:
            content, is_error = CHECKPOINT_REFUSAL.format(name=block["name"]), True
        results.append({"type": "tool_result", "tool_use_id": block["id"],
                        "content": content, "is_error": is_error})
    text = "\n".join(b["text"] for b in blocks if b["type"] == "text")
    entry = {"prompt": round_prompt(attempt, data), "assistant": blocks, "results": results,
             "files": {"mind": await attempts.read_file(ctx.store, session_id, MIND_FILE),
                       "memo": await attempts.read_file(ctx.store, session_id, MEMO_FILE)}}
    await conn.execute(
        "UPDATE checkpoint_attempts SET rounds = rounds || %s::jsonb,"
        " rounds_used = rounds_used + 1,"
        " final_text = CASE WHEN %s THEN %s ELSE final_text END WHERE attempt_id=%s",
        (json.dumps([entry]), not results, text, data.attempt_id))
    return RoundResult(done=not results, tool_calls=len(results))
