"""Check, assemble and store a checkpoint; and the move-half path that needs no model.

A checkpoint is stored once, keyed by its attempt (`checkpoint_id_for`): a retried store
finds the row and returns it. Storing writes, in one transaction, the checkpoint's notice
row in the record, its `checkpoints` row (with the next request's size before and after,
measured as call_model measures it, the pre-pass applied, so they compare like with like)
and the attempt's outcome. The move-half path condenses nothing: it moves the earliest
half out with the previous mind and now, and every user message that moves out in the memo.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from temporalio import activity

from activities import checkpoint_attempts as attempts
from activities.checkpoint_payloads import (
    MoveInput,
    PrepareInput,
    PreviousCheckpoint,
    StoreInput,
    StoreResult,
    checkpoint_id_for,
)
from activities.context import SessionContext
from activities.record import NewRow, insert_row, load_rows, load_seqs
from activities.tools import Skill, read_skill
from schemas.checkpoint.budgets import CheckpointBudgets
from schemas.checkpoint.checks import CheckpointCheck, resolve_checkpoint, validate_checkpoint
from schemas.checkpoint.memo import MemoAssembly, assemble_memo
from schemas.checkpoint.mind import MindDocument
from schemas.checkpoint.prepass import prepass
from schemas.checkpoint.render import (
    CarriedSkill,
    recent_files,
    record_hint,
    render_checkpoint,
    select_carried_skills,
)
from schemas.checkpoint.request import full_mind_file
from schemas.context import choose_cut, estimate_tokens
from schemas.messages import MessageType, RecordRow
from schemas.tokens import count_tokens

__all__ = ["check", "move_half", "store_model_checkpoint"]


async def check(conn: AsyncConnection, attempt: dict[str, Any],
                budgets: CheckpointBudgets) -> CheckpointCheck:
    mind_text, memo_text = attempts.files_state(attempt)
    return validate_checkpoint(
        final_text=attempt["final_text"] or "",
        mind=MindDocument(text=mind_text),
        previous_mind=MindDocument(text=attempt["previous_mind"]),
        checklist_original=attempt["checklist_original"],
        checklist_edited=memo_text,
        candidates=await attempts.candidate_texts(conn, attempt),
        budgets=budgets,
    )


@dataclass
class _Checkpoint:
    """One checkpoint to store, made by the model's turn or by the move-half path."""

    kind: str
    checkpoint_id: str
    attempt_id: str
    session_id: str
    record_seq: int
    window_start: int
    cut: int
    upto: int
    budgets: CheckpointBudgets
    mind_record: str
    mind_context: str
    memo: MemoAssembly
    now_text: str
    previous: PreviousCheckpoint | None
    previous_id: str | None
    carried: list[int]
    fallbacks: list[str]
    user_name: str
    keep_recent_seq: int


def _as_of(now_text: str, meta: PrepareInput, cut_seq: int) -> str:
    """A checkpoint over the earlier half saw only that half: its now is dated, so the
    newer messages that follow it verbatim win where the two differ."""
    if meta.portion >= 1.0:
        return now_text
    return (f"(Written over messages up to #{cut_seq - 1} only; the messages after it, "
            f"kept word for word below, are newer and win where they differ.)\n{now_text}")


async def store_model_checkpoint(ctx: SessionContext, conn: AsyncConnection,
                                 data: StoreInput) -> StoreResult:
    """The model's checkpoint: checked, resolved (fallbacks where it falls short), stored."""
    checkpoint_id = checkpoint_id_for(data.attempt_id)
    done = await attempts.stored(conn, checkpoint_id)
    if done:
        return done
    attempt = await attempts.attempt(conn, data.attempt_id)
    meta = attempts.meta(attempt)
    if data.abort_reason:
        return await attempts.fail(conn, data.attempt_id, data.abort_reason)
    budgets = meta.budgets()
    found = await check(conn, attempt, budgets)
    full_copy = full_mind_file(data.attempt_id.rsplit(":a", 1)[-1])
    outcome = resolve_checkpoint(
        check=found, mind=MindDocument(text=attempts.files_state(attempt)[0]),
        previous_mind=MindDocument(text=attempt["previous_mind"]),
        candidates=await attempts.candidate_texts(conn, attempt),
        memo_untouched_rounds_exhausted=data.rounds_exhausted, budgets=budgets,
        full_mind_path=full_copy)
    if outcome.failed:
        return await attempts.fail(conn, data.attempt_id, outcome.reason or "no usable now")
    # Both are set on every outcome that did not fail (schemas.checkpoint.checks).
    assert outcome.mind_record_text is not None and outcome.mind_context_text is not None
    if outcome.mind_context_text != outcome.mind_record_text:
        # Read-only to the agent: it lies in Keel's own folder (activities.tools).
        await ctx.store.write(meta.session_id, full_copy, outcome.mind_record_text.encode(),
                              op_id=f"full-mind:{data.attempt_id}")
    return await _store(ctx, conn, _Checkpoint(
        kind="model", checkpoint_id=checkpoint_id, attempt_id=data.attempt_id,
        session_id=meta.session_id, record_seq=data.record_seq,
        window_start=meta.window_start_seq, cut=attempt["cut_seq"], upto=meta.upto_seq,
        budgets=budgets, mind_record=outcome.mind_record_text,
        mind_context=outcome.mind_context_text, memo=outcome.memo,
        now_text=_as_of(outcome.now_text or "", meta, attempt["cut_seq"]),
        previous=await attempts.previous(conn, meta.checkpoint_id),
        previous_id=meta.checkpoint_id, carried=list(attempt["in_turn_user_seqs"]),
        fallbacks=list(outcome.fallbacks), user_name=meta.user_name,
        keep_recent_seq=meta.turn_first_seq))


async def move_half(ctx: SessionContext, conn: AsyncConnection,
                    data: MoveInput) -> StoreResult:
    """The earliest half of the live window moved out without the model."""
    checkpoint_id = checkpoint_id_for(data.attempt_id)
    done = await attempts.stored(conn, checkpoint_id)
    if done:
        return done
    budgets = data.budgets()
    window = await ctx.windows.load(conn, data.session_id, data.window_start_seq,
                                    data.upto_seq, data.checkpoint_id)
    live = [r for r in window.rows if r.seq >= data.window_start_seq]
    cut = choose_cut(live, sum(r.token_count for r in live) // 2)
    if cut is None:
        return StoreResult(stored=False, reason="nothing left to move out")
    previous = await attempts.previous(conn, data.checkpoint_id)
    moving = [r for r in live if r.seq < cut]
    candidates = await attempts.candidates(conn, data.session_id, previous, moving,
                                           data.turn_first_seq)
    memo = assemble_memo(candidates, budgets)  # every user message that moves out
    mind = previous.mind_text if previous else MindDocument.template().text
    carried = sorted({r.seq for r in moving if r.type == MessageType.USER
                      and r.seq >= data.turn_first_seq}
                     | {s for s in (previous.carried_seqs if previous else [])
                        if s >= data.turn_first_seq})
    return await _store(ctx, conn, _Checkpoint(
        kind="move_half", checkpoint_id=checkpoint_id, attempt_id=data.attempt_id,
        session_id=data.session_id, record_seq=data.record_seq,
        window_start=data.window_start_seq, cut=cut, upto=data.upto_seq, budgets=budgets,
        mind_record=mind, mind_context=mind, memo=memo,
        now_text=previous.now_text if previous else "", previous=previous,
        previous_id=data.checkpoint_id, carried=carried,
        fallbacks=["moved the earliest half out without the model", *memo.fallbacks],
        user_name=data.user_name, keep_recent_seq=data.turn_first_seq))


async def _context_tokens(ctx: SessionContext, conn: AsyncConnection, session_id: str,
                          start: int, upto: int, checkpoint_id: str | None,
                          keep_recent_seq: int) -> int:
    """The next request's size, measured as call_model measures it (the pre-pass
    applied), so before and after compare like with like."""
    window = await ctx.windows.load(conn, session_id, start, upto, checkpoint_id)
    rows = prepass(window.rows, keep_recent_seq=keep_recent_seq).rows
    return estimate_tokens(window.system, rows, [window.checkpoint_text or ""])


def _carried_skills(moving: list[RecordRow], previous: PreviousCheckpoint | None,
                    budgets: CheckpointBudgets, known: list[Skill]) -> list[CarriedSkill]:
    loaded: dict[str, int] = {}
    for s in previous.skills if previous else []:
        loaded[s["name"]] = int(s.get("loaded_seq", 0))
    for r in moving:
        if r.type == MessageType.TOOL_RESULT and isinstance(r.content, dict):
            name = r.content.get("skill")
            if name and not r.content.get("is_error"):
                loaded[name] = r.seq
    skills = []
    for name, seq in loaded.items():
        text = read_skill(known, name)  # as it reads now
        if text is not None:
            skills.append(CarriedSkill(name=name, text=text, loaded_seq=seq))
    return select_carried_skills(skills, budgets)


async def _render(ctx: SessionContext, c: _Checkpoint,
                  moving: list[RecordRow]) -> tuple[str, list[CarriedSkill], list[str],
                                                    list[str]]:
    """The checkpoint's text, its carried skills, and the files modified and read."""
    previous = c.previous
    skills = _carried_skills(moving, previous, c.budgets, await ctx.prompt.skills())
    files = recent_files(moving,
                         modified_before=previous.files_modified if previous else [],
                         read_before=previous.files_read if previous else [],
                         budgets=c.budgets)
    rendered = render_checkpoint(
        mind_text=c.mind_context, memo=c.memo, now_text=c.now_text, skills=skills,
        files_modified=files.modified, files_read=files.read,
        files_pushed_out=files.pushed_out, record_hint=record_hint(c.session_id, c.cut),
        in_turn_user_seqs=c.carried, user_name=c.user_name)
    return rendered, skills, files.modified, files.read


async def _store(ctx: SessionContext, conn: AsyncConnection, c: _Checkpoint) -> StoreResult:
    moving = await load_rows(conn, c.session_id, c.window_start, c.cut - 1)
    rendered, skills, modified, read = await _render(ctx, c, moving)
    moved_tokens = sum(r.token_count for r in moving)
    before = await _context_tokens(ctx, conn, c.session_id, c.window_start, c.upto,
                                   c.previous_id, c.keep_recent_seq)
    carried_rows = await load_seqs(conn, c.session_id, [s for s in c.carried if s < c.cut])
    after_rows = prepass(carried_rows + await load_rows(conn, c.session_id, c.cut, c.upto),
                         keep_recent_seq=c.keep_recent_seq).rows
    after = estimate_tokens(await ctx.prompt.system_prompt(c.session_id), after_rows,
                            [rendered])
    async with conn.transaction():
        await insert_row(conn, NewRow(
            session_id=c.session_id, seq=c.record_seq,
            input_id=f"checkpoint-{c.checkpoint_id}", type=MessageType.CHECKPOINT,
            text=rendered,
            content={"checkpoint_id": c.checkpoint_id, "kind": c.kind, "cut_seq": c.cut}))
        await conn.execute(
            "INSERT INTO checkpoints (checkpoint_id, session_id, kind, record_seq, cut_seq,"
            " mind_text, mind_context_text, memo, memo_dropped_seqs, now_text, skills,"
            " files_modified, files_read, fallbacks, rendered, rendered_tokens,"
            " tokens_moved_out, carried_seqs, upto_seq, window_tokens_before,"
            " window_tokens_after) VALUES"
            " (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
            " ON CONFLICT (checkpoint_id) DO NOTHING",
            (c.checkpoint_id, c.session_id, c.kind, c.record_seq, c.cut, c.mind_record,
             c.mind_context, json.dumps([e.model_dump() for e in c.memo.entries]),
             json.dumps(c.memo.dropped_seqs), c.now_text,
             json.dumps([s.model_dump() for s in skills]), json.dumps(modified),
             json.dumps(read), json.dumps(c.fallbacks), rendered, count_tokens(rendered),
             moved_tokens, json.dumps(c.carried), c.upto, before, after))
        await conn.execute(
            "UPDATE checkpoint_attempts SET outcome='stored' WHERE attempt_id=%s",
            (c.attempt_id,))
    activity.logger.info("checkpoint %s stored: moved %d tokens, fallbacks %s",
                         c.checkpoint_id, moved_tokens, c.fallbacks)
    stored = await attempts.stored(conn, c.checkpoint_id)
    assert stored is not None
    return stored
