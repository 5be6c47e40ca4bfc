"""Prepare a checkpoint attempt: choose the cut and the turn's view, write the two files.

The turn is shown what the request it interrupts showed: old tool outputs shrunk by the
pre-pass (and so the same, cached, prefix). Its view (`schemas.checkpoint.policy.
checkpoint_view`) is the whole conversation when the turn fits the window, else all of it
but the newest tool output's text, else the largest earlier part that fits (then it
condenses only that part, and `portion` says the share it was shown). What prepare chose is
its input as stored with the attempt (the first entry of its rounds): every later step
reads it back from there. A retried prepare finds its attempt and returns it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from temporalio import activity

from activities import checkpoint_attempts as attempts
from activities.checkpoint_payloads import PrepareInput, PrepareResult, PreviousCheckpoint
from activities.context import SessionContext
from activities.window import LoadedWindow
from schemas.checkpoint.budgets import CheckpointBudgets
from schemas.checkpoint.memo import MemoCandidate, memo_candidates, render_checklist
from schemas.checkpoint.mind import MindDocument
from schemas.checkpoint.policy import (
    RATIO_MIN,
    CheckpointView,
    checkpoint_reply_room,
    checkpoint_view,
    checkpoint_view_room,
)
from schemas.checkpoint.prepass import prepass
from schemas.checkpoint.request import (
    MEMO_FILE,
    MIND_FILE,
    REQUEST_MARKER,
    checkpoint_instruction,
)
from schemas.context import (
    choose_cut,
    cut_boundaries,
    estimate_tokens,
    leave_out_output,
    newest_tool_output,
)
from schemas.messages import MessageType, RecordRow

__all__ = ["prepare"]


@dataclass
class _Turn:
    """The checkpoint turn as prepare weighs it: what it would say, and its size."""

    data: PrepareInput
    budgets: CheckpointBudgets
    window: LoadedWindow
    live: list[RecordRow]
    shown_rows: list[RecordRow]  # the window as the interrupted request showed it
    previous: PreviousCheckpoint | None
    previous_mind: str
    kept_rows: list[RecordRow]
    tools: list[dict[str, Any]]
    reply_room: int

    def at(self, cut: int) -> tuple[list[MemoCandidate], str, list[int]]:
        """The candidates, instruction and in-turn user seqs of a cut at `cut`."""
        data, previous = self.data, self.previous
        moving = [r for r in self.live if r.seq < cut]
        candidates = memo_candidates(self.kept_rows, moving, in_turn_from=data.turn_first_seq)
        in_turn = sorted({r.seq for r in moving if r.type == MessageType.USER
                          and r.seq >= data.turn_first_seq}
                         | {s for s in (previous.carried_seqs if previous else [])
                            if s >= data.turn_first_seq})
        instruction = checkpoint_instruction(
            mind_path=MIND_FILE, memo_path=MEMO_FILE, mind_text=self.previous_mind,
            checklist_text=render_checklist(candidates), budgets=self.budgets,
            user_name=data.user_name, in_turn_user_seqs=in_turn)
        return candidates, instruction, in_turn

    def size(self, shown: list[RecordRow], instruction: str) -> int:
        """The first request's estimate (the usage ratio applied) with its reply room."""
        raw = estimate_tokens(self.window.system, shown, [
            self.window.checkpoint_text or "", REQUEST_MARKER, instruction], tools=self.tools)
        return int(raw * max(self.data.usage_ratio, RATIO_MIN)) + self.reply_room


@dataclass
class _View:
    view: CheckpointView
    cut: int
    size: int = 0  # the first request's estimate with its reply room
    omit_seq: int | None = None
    portion: float | None = None  # the share shown, when only an earlier part is


def _choose_view(turn: _Turn, cut: int, instruction: str) -> _View:
    """What the turn is shown (for a whole-window checkpoint: a smaller one condenses the
    earlier part it was told to): the most whose first request leaves every later request
    of the turn room in the window (`checkpoint_view_room`)."""
    live, shown_rows = turn.live, turn.shown_rows
    room = checkpoint_view_room(turn.data.window.context_window, turn.reply_room)
    newest = newest_tool_output(live)
    full = turn.size(shown_rows, instruction)
    without = turn.size(leave_out_output(shown_rows, newest.seq), instruction) \
        if newest is not None and full > room else None
    earlier: list[tuple[int, int]] = []
    if full > room and (without is None or without > room):
        for at in (b for b in cut_boundaries(live) if b <= cut):
            earlier.append((at, turn.size([r for r in shown_rows if r.seq < at],
                                          turn.at(at)[1])))
    view, earlier_cut = checkpoint_view(full, without, earlier, room)
    if view in (CheckpointView.EARLIER, CheckpointView.NONE):
        # Past the threshold by more than the margin: the whole view with its later rounds
        # squeezed (the rounds size themselves, activities.checkpoint_turn) over a part.
        tight = checkpoint_view_room(turn.data.window.context_window, turn.reply_room,
                                     tight=True)
        if full <= tight or (without is not None and without <= tight):
            view, earlier_cut = checkpoint_view(full, without, [], tight)
    activity.logger.info("checkpoint view %s: full turn %d, without the newest "
                         "output %s, room %d", view.value, full, without, room)
    if view is CheckpointView.WITHOUT_NEWEST_OUTPUT:
        assert newest is not None and without is not None
        return _View(view, cut, size=without, omit_seq=newest.seq)
    if view is CheckpointView.EARLIER:
        assert earlier_cut is not None
        total = max(1, sum(r.token_count for r in live))
        shown_share = sum(r.token_count for r in live if r.seq < earlier_cut) / total
        return _View(view, earlier_cut, size=dict(earlier)[earlier_cut],
                     portion=min(0.99, round(shown_share, 2)))
    return _View(view, cut, size=full)


async def _write_attempt(ctx: SessionContext, conn: AsyncConnection, data: PrepareInput,
                         cut: int, candidates: list[MemoCandidate], in_turn: list[int],
                         previous_mind: str) -> None:
    checklist = render_checklist(candidates)
    await attempts.write_files(ctx.store, data.session_id, previous_mind, checklist)
    await conn.execute(
        "INSERT INTO checkpoint_attempts (attempt_id, session_id, cut_seq, upto_seq,"
        " previous_mind, checklist_original, candidates, in_turn_user_seqs, mind_path,"
        " memo_path) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
        " ON CONFLICT (attempt_id) DO NOTHING",
        (data.attempt_id, data.session_id, cut, data.upto_seq, previous_mind, checklist,
         json.dumps([c.model_dump(exclude={"text"}) for c in candidates]),
         json.dumps(in_turn), MIND_FILE, MEMO_FILE))
    await conn.execute(
        "UPDATE checkpoint_attempts SET rounds = %s WHERE attempt_id=%s",
        (json.dumps([{"meta": data.model_dump()}]), data.attempt_id))


async def prepare(ctx: SessionContext, conn: AsyncConnection,
                  data: PrepareInput) -> PrepareResult:
    done = await (await conn.execute(
        "SELECT cut_seq, jsonb_array_length(candidates) FROM checkpoint_attempts"
        " WHERE attempt_id=%s", (data.attempt_id,))).fetchone()
    if done:
        return PrepareResult(ok=True, cut_seq=done[0], candidates=done[1])
    budgets = data.budgets()
    window = await ctx.windows.load(conn, data.session_id, data.window_start_seq,
                                    data.upto_seq, data.checkpoint_id, data.instructions,
                                    hard_limit=data.window.hard_limit)
    live = [r for r in window.rows if r.seq >= data.window_start_seq]
    shown_rows = prepass(window.rows, keep_recent_seq=data.turn_first_seq).rows
    previous = await attempts.previous(conn, data.checkpoint_id)
    previous_mind = previous.mind_text if previous else MindDocument.template().text
    cut = choose_cut(live, budgets.recent_tail, max_fraction=data.portion)
    if cut is None:
        return PrepareResult(ok=False, reason="nothing in the window can move out")
    turn = _Turn(
        data=data, budgets=budgets, window=window, live=live, shown_rows=shown_rows,
        previous=previous, previous_mind=previous_mind,
        kept_rows=await attempts.kept_rows(conn, data.session_id, previous,
                                           data.turn_first_seq),
        tools=await ctx.prompt.session_tools(data.session_id, data.agent, data.mcp_tools),
        reply_room=checkpoint_reply_room(data.window.context_window,
                                         data.window.max_output_tokens))
    candidates, instruction, in_turn = turn.at(cut)
    chosen = _View(CheckpointView.EARLIER, cut, size=turn.size(
        [r for r in shown_rows if r.seq < cut], instruction))
    if data.portion >= 1.0:
        chosen = _choose_view(turn, cut, instruction)
        if chosen.view is CheckpointView.NONE:
            return PrepareResult(ok=False, reason="no earlier part fits a checkpoint turn")
        if chosen.view is CheckpointView.EARLIER:
            candidates, instruction, in_turn = turn.at(chosen.cut)
            data = data.model_copy(update={"portion": chosen.portion})
    data = data.model_copy(update={"view": chosen.view.value, "omit_seq": chosen.omit_seq,
                                   "first_request_tokens": chosen.size - turn.reply_room})
    await _write_attempt(ctx, conn, data, chosen.cut, candidates, in_turn, previous_mind)
    return PrepareResult(ok=True, cut_seq=chosen.cut, candidates=len(candidates),
                         view=chosen.view.value)
