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
from dataclasses import dataclass
from typing import Any

from anthropic.types import Message
from psycopg import AsyncConnection

from activities import checkpoint_attempts as attempts
from activities.attachments import with_bytes
from activities.checkpoint_payloads import PrepareInput, RoundInput, RoundResult
from activities.context import SessionContext
from activities.model.usage import spend_of_reply
from activities.record import taken_tool_ids
from activities.tools import ToolContext, execute_tool
from activities.window import LoadedWindow
from schemas.checkpoint.policy import (
    RATIO_MIN,
    checkpoint_reply_room,
    results_room,
    round_reply_room,
)
from schemas.checkpoint.prepass import prepass
from schemas.checkpoint.problems import Problem
from schemas.checkpoint.request import (
    FINAL_ROUND_NOTE,
    MEMO_FILE,
    MIND_FILE,
    REQUEST_MARKER,
    RESULT_CUT_NOTE,
    RESULT_LEFT_OUT,
    UNCHANGED_FILE_NOTE,
    checkpoint_instruction,
    repair_request,
)
from schemas.context import MESSAGE_OVERHEAD_TOKENS, assemble_messages, leave_out_output
from schemas.request import append_user, block_count, checkpoint_round_messages, turn_request
from schemas.tokens import count_tokens, truncate_to_tokens
from schemas.tools import CHECKPOINT_TOOL_NAMES, unique_tool_ids

__all__ = ["CHECKPOINT_REFUSAL", "PlannedRound", "flush_request", "round_request", "run_round"]

CUT_NOTE_TOKENS = 40  # the note a cut result ends with

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
        meta.instructions, hard_limit=meta.window.hard_limit)
    rows = prepass(window.rows, keep_recent_seq=meta.turn_first_seq).rows
    if meta.portion < 1.0:
        # Too large for a checkpoint turn: it sees only the part it condenses.
        rows = [r for r in rows if r.seq < attempt["cut_seq"]]
    elif meta.omit_seq is not None:
        rows = leave_out_output(rows, meta.omit_seq)
    # The files the pre-pass kept (the turn's own) are sent, as a turn's request sends them.
    rows = await with_bytes(conn, meta.session_id, rows)
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
    conversation_blocks = block_count(messages)
    append_user(messages, [{"type": "text", "text": instruction}])
    return turn_request(
        model=meta.model, max_tokens=min(max_tokens, _reply_room(meta)),
        system=window.system, messages=messages, conversation_blocks=conversation_blocks,
        checkpoint_text=window.checkpoint_text,
        tools=await ctx.prompt.session_tools(meta.session_id, meta.agent, meta.mcp_tools))


def round_prompt(attempt: dict[str, Any], data: RoundInput) -> str | None:
    """Keel's words before this round: the repair request, or the last-round note."""
    if data.repair:
        problems = [Problem(**p) for p in attempt["problems"]]
        return repair_request(problems, mind_path=attempt["mind_path"],
                              memo_path=attempt["memo_path"])
    return FINAL_ROUND_NOTE if data.final else None


@dataclass
class PlannedRound:
    """A round's request as sized against the window, or None when not even the now fits
    (the turn then ends with the files as they are)."""

    request: dict[str, Any] | None
    prompt: str | None  # Keel's words before it, as sent (and recorded with the round)
    final: bool  # it asks for the now alone
    predicted: int  # Keel's estimate of its prompt: the API's count so far plus the rest


def _text_tokens(blocks: list[dict[str, Any]]) -> int:
    """Keel's estimate of message blocks (text, tool calls, tool results)."""
    total = 0
    for b in blocks:
        if b.get("type") == "text":
            total += count_tokens(str(b.get("text", "")))
        elif b.get("type") == "tool_use":
            total += count_tokens(str(b.get("name", ""))) + count_tokens(
                json.dumps(b.get("input") or {}))
        elif b.get("type") == "tool_result":
            total += count_tokens(str(b.get("content", "")))
    return total + MESSAGE_OVERHEAD_TOKENS


def _predicted(meta: PrepareInput, rounds: list[dict[str, Any]], prompt: str | None) -> int:
    """The next round's prompt: the newest round the API counted (its prompt and reply, in
    its own numbers) plus, estimated, what came after it (its results) and this round's
    prompt; before any round, prepare's estimate of the first request."""
    ratio = max(meta.usage_ratio, RATIO_MIN)
    total = meta.first_request_tokens
    for past in rounds:
        usage = past.get("usage")
        if usage:  # the API's count of that round: everything before its results
            total = usage["input"] + usage["output"]
        else:
            said = [{"type": "text", "text": past["prompt"]}] if past.get("prompt") else []
            total += int((_text_tokens(said) + _text_tokens(past["assistant"])) * ratio)
        if past["results"]:
            total += int(_text_tokens(past["results"]) * ratio)
    if prompt:
        total += int(_text_tokens([{"type": "text", "text": prompt}]) * ratio)
    return total


def _without_results(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rounds with their tool results left out (a line each): what the last round is
    sent when the whole turn no longer fits, so the now can still be written."""
    return [{**past, "usage": None, "results": [
        {**r, "content": RESULT_LEFT_OUT} for r in past["results"]]} for past in rounds]


async def round_request(ctx: SessionContext, conn: AsyncConnection, attempt: dict[str, Any],
                        data: RoundInput) -> PlannedRound:
    """This round's request (the conversation, Keel's instruction, the rounds so far),
    sized so it fits the window under the API's count: a tool round with no room left for
    the rounds after it becomes the last (the now alone); a last round that does not fit
    leaves the rounds' results out; None when even that does not fit."""
    meta = attempts.meta(attempt)
    window_size, reply_room = meta.window.context_window, _reply_room(meta)
    rounds = list(attempt["rounds"][1:])
    prompt, final = round_prompt(attempt, data), data.final
    room = round_reply_room(_predicted(meta, rounds, prompt), window_size, reply_room,
                            tool_round=not final)
    if room is None and not final and not data.repair:
        prompt, final = FINAL_ROUND_NOTE, True
        room = round_reply_room(_predicted(meta, rounds, prompt), window_size, reply_room,
                                tool_round=False)
    if room is None and final:
        rounds = _without_results(rounds)
        room = round_reply_room(_predicted(meta, rounds, prompt), window_size, reply_room,
                                tool_round=False)
    predicted = _predicted(meta, rounds, prompt)
    if room is None:
        return PlannedRound(None, prompt, final, predicted)
    window, conversation = await _conversation(ctx, conn, attempt, meta)
    conversation_blocks = block_count(conversation)
    instruction = REQUEST_MARKER + "\n" + checkpoint_instruction(
        mind_path=attempt["mind_path"], memo_path=attempt["memo_path"],
        mind_text=attempt["previous_mind"], checklist_text=attempt["checklist_original"],
        budgets=meta.budgets(), user_name=meta.user_name,
        in_turn_user_seqs=list(attempt["in_turn_user_seqs"]))
    messages = checkpoint_round_messages(conversation, instruction, rounds, prompt)
    request = turn_request(
        model=meta.model, max_tokens=room, system=window.system,
        messages=messages, conversation_blocks=conversation_blocks,
        checkpoint_text=window.checkpoint_text,
        tools=await ctx.prompt.session_tools(meta.session_id, meta.agent, meta.mcp_tools),
        final=final)
    return PlannedRound(request, prompt, final, predicted)


async def _result(tools: ToolContext, attempt: dict[str, Any], block: dict[str, Any],
                  files: dict[str, str]) -> dict[str, Any]:
    """One call of the round answered: a read of a scratch file still as the request shows
    it is answered in a line (its text is there already), other allowed calls run, the
    rest refused."""
    name, args = block["name"], block.get("input") or {}
    originals = {attempt["mind_path"]: attempt["previous_mind"],
                 attempt["memo_path"]: attempt["checklist_original"]}
    path = args.get("path") if isinstance(args, dict) else None
    if (name == "read_file" and isinstance(path, str) and path in originals
            and files.get(path) == originals[path]
            and not args.get("offset") and not args.get("length")):
        content, is_error = UNCHANGED_FILE_NOTE.format(path=path), False
    elif name in CHECKPOINT_TOOL_NAMES:
        output = await execute_tool(tools, name, args)
        content, is_error = output.text, output.is_error
    else:
        content, is_error = CHECKPOINT_REFUSAL.format(name=name), True
    return {"type": "tool_result", "tool_use_id": block["id"], "content": content,
            "is_error": is_error}


def _fit_results(results: list[dict[str, Any]], room: int, ratio: float) -> None:
    """Cut the round's results (in place) so they weigh at most `room` tokens: the
    largest first, each to an even share, with a note saying so."""
    sizes = [int(count_tokens(str(r["content"])) * ratio) for r in results]
    if sum(sizes) <= room:
        return
    share = max(0, room // max(1, len(results)) - CUT_NOTE_TOKENS)
    for r, size in zip(results, sizes, strict=True):
        if size > share:
            text = truncate_to_tokens(str(r["content"]), int(share / max(ratio, RATIO_MIN)))
            r["content"] = text + RESULT_CUT_NOTE.format(shown=share, total=size)


async def run_round(ctx: SessionContext, conn: AsyncConnection, attempt: dict[str, Any],
                    data: RoundInput, planned: PlannedRound, message: Message) -> RoundResult:
    """The round's reply acted on (its allowed calls run, the others refused, the results
    cut to the room the turn has left under the API's count) and recorded with the files
    as it left them and the API's count of it."""
    blocks = [b.model_dump(mode="json", exclude_none=True) for b in message.content]
    blocks = [b for b in blocks if b.get("type") in ("text", "tool_use")]
    session_id = attempt["session_id"]
    # Ids the API has seen in this turn's requests: the conversation's calls, the rounds'.
    taken = await taken_tool_ids(conn, session_id, blocks) | {
        b.get("id") for past in attempt["rounds"][1:] for b in past.get("assistant", [])
        if b.get("type") == "tool_use"}
    unique_tool_ids(blocks, taken, attempt["upto_seq"])
    # The files as the previous round left them, from the database: a retried round
    # starts from the same text (edits are never applied twice), on any worker.
    mind_text, memo_text = attempts.files_state(attempt)
    await attempts.write_files(ctx.store, session_id, mind_text, memo_text)
    tools = ToolContext(session_id=session_id, store=ctx.store,
                        skills=await ctx.prompt.skills(), conn=conn,
                        upto_seq=attempt["upto_seq"], editable={MIND_FILE, MEMO_FILE})
    results = []
    for block in blocks:
        if block["type"] == "tool_use":
            files = {MIND_FILE: await attempts.read_file(ctx.store, session_id, MIND_FILE),
                     MEMO_FILE: await attempts.read_file(ctx.store, session_id, MEMO_FILE)}
            results.append(await _result(tools, attempt, block, files))
    meta = attempts.meta(attempt)
    usage = message.usage
    counted = {"input": usage.input_tokens + (usage.cache_read_input_tokens or 0)
               + (usage.cache_creation_input_tokens or 0), "output": usage.output_tokens}
    _fit_results(results, results_room(counted["input"], counted["output"],
                                       meta.window.context_window),
                 max(meta.usage_ratio, RATIO_MIN))
    text = "\n".join(b["text"] for b in blocks if b["type"] == "text")
    spent = spend_of_reply(message, meta.model, ctx.settings.prices)
    entry = {"prompt": planned.prompt, "assistant": blocks, "results": results,
             "usage": counted, "spent": spent.model_dump(), "final": planned.final,
             "files": {"mind": await attempts.read_file(ctx.store, session_id, MIND_FILE),
                       "memo": await attempts.read_file(ctx.store, session_id, MEMO_FILE)}}
    await conn.execute(
        "UPDATE checkpoint_attempts SET rounds = rounds || %s::jsonb,"
        " rounds_used = rounds_used + 1,"
        " final_text = CASE WHEN %s THEN %s ELSE final_text END WHERE attempt_id=%s",
        (json.dumps([entry]), not results, text, data.attempt_id))
    return RoundResult(done=not results, tool_calls=len(results), final=planned.final,
                       spent=spent)
