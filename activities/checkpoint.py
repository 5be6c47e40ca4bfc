"""The checkpoint's activities: write the two files, one bounded model round, the checks,
assemble and store; and the move-half path that needs no model.

Every step is keyed by its attempt id: a retried step finds its own work in
`checkpoint_attempts` / `checkpoints` and returns it instead of doing it twice.

The checkpoint turn's requests carry the same tools, system prompt and (pre-passed)
conversation prefix as the request they interrupt, with cache breakpoints, so they read
that prefix from the prompt cache; its limits (read files, edit only the mind and memo
files) are enforced on the calls it makes, never by changing the tools list. Its view
(`schemas.checkpoint.policy.checkpoint_view`) is the whole conversation when the turn fits
the window, else all of it but the newest tool output's text, else the largest earlier
part that fits.
"""

from __future__ import annotations

import json
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.model import create_message, with_heartbeat
from activities.record import NewRow, insert_row, load_rows, load_seqs
from activities.session import LoadedWindow, SessionActivities
from activities.tools import Skill, ToolContext, execute_tool, read_skill
from schemas.agent import AgentSpec
from schemas.checkpoint.budgets import CheckpointBudgets
from schemas.checkpoint.checks import CheckpointCheck, resolve_checkpoint, validate_checkpoint
from schemas.checkpoint.memo import (
    MemoAssembly,
    MemoCandidate,
    assemble_memo,
    memo_candidates,
    render_checklist,
)
from schemas.checkpoint.mind import MindDocument
from schemas.checkpoint.policy import (
    CheckpointView,
    ModelWindow,
    checkpoint_reply_room,
    checkpoint_view,
)
from schemas.checkpoint.prepass import prepass
from schemas.checkpoint.problems import Problem
from schemas.checkpoint.render import (
    CarriedSkill,
    recent_files,
    record_hint,
    render_checkpoint,
    select_carried_skills,
)
from schemas.checkpoint.request import (
    FINAL_ROUND_NOTE,
    MEMO_FILE,
    MIND_FILE,
    REQUEST_MARKER,
    checkpoint_instruction,
    full_mind_file,
    repair_request,
)
from schemas.context import (
    assemble_messages,
    choose_cut,
    cut_boundaries,
    estimate_tokens,
    leave_out_output,
    newest_tool_output,
    with_cache_breakpoints,
)
from schemas.mcp import McpTool
from schemas.messages import MessageType, RecordRow
from schemas.tokens import count_tokens
from schemas.tools import CHECKPOINT_TOOL_NAMES


class WindowRef(BaseModel):
    """The live window a checkpoint (or the move) is taken over, and the model's sizes."""

    session_id: str
    attempt_id: str
    window_start_seq: int
    upto_seq: int
    checkpoint_id: str | None = None
    turn_first_seq: int
    window: ModelWindow
    user_name: str = "user"
    # The session's agent and MCP tools: the checkpoint turn carries the same system prompt
    # (instructions included) and tools as the request it interrupts.
    agent: AgentSpec | None = None
    mcp_tools: list[McpTool] = Field(default_factory=list)

    def budgets(self) -> CheckpointBudgets:
        return CheckpointBudgets.for_model(self.window)

    @property
    def instructions(self) -> str:
        return self.agent.instructions if self.agent else ""


class PrepareInput(WindowRef):
    model: str
    portion: float = 1.0  # the most it condenses; after prepare, the share it was shown
    view: str = "full"  # schemas.checkpoint.policy.CheckpointView, chosen by prepare
    omit_seq: int | None = None  # the newest tool output left out of the turn's view
    usage_ratio: float = 1.0  # the API's count over Keel's estimate, as call_model uses it


class PrepareResult(BaseModel):
    ok: bool
    reason: str = ""
    cut_seq: int = 0
    candidates: int = 0
    view: str = "full"  # what the checkpoint turn is shown (schemas.checkpoint.policy)


class RoundInput(BaseModel):
    attempt_id: str
    round_no: int
    repair: bool = False
    final: bool = False


class RoundResult(BaseModel):
    done: bool
    tool_calls: int = 0


class CheckResult(BaseModel):
    problems: list[Problem] = Field(default_factory=list)


class StoreInput(BaseModel):
    attempt_id: str
    record_seq: int
    rounds_exhausted: bool = False
    abort_reason: str | None = None


class MoveInput(WindowRef):
    record_seq: int


class StoreResult(BaseModel):
    stored: bool
    reason: str = ""
    checkpoint_id: str | None = None
    cut_seq: int = 0
    fallbacks: list[str] = Field(default_factory=list)
    mind_text: str = ""
    memo_text: str = ""
    now_text: str = ""
    window_tokens_after: int = 0
    tokens_saved: int = 0  # the next request's size before less after, as call_model measures
    tokens_moved_out: int = 0


class PreviousCheckpoint(BaseModel):
    mind_text: str
    memo: list[dict[str, Any]]
    memo_dropped_seqs: list[int]
    now_text: str
    skills: list[dict[str, Any]]
    files_modified: list[str]
    files_read: list[str]
    carried_seqs: list[int]


CHECKPOINT_REFUSAL = (
    "{name} refused: during a checkpoint you may only read files (read_file) and edit the "
    "mind and memo files (edit_file)."
)


def checkpoint_id_for(attempt_id: str) -> str:
    return f"ckpt:{attempt_id}"


class CheckpointActivities:
    def __init__(self, settings: Any) -> None:
        self.session = SessionActivities(settings)
        self.settings = settings

    # ----- shared loading ---------------------------------------------------------------

    async def _previous(self, conn: AsyncConnection,
                        checkpoint_id: str | None) -> PreviousCheckpoint | None:
        if not checkpoint_id:
            return None
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "SELECT mind_text, memo, memo_dropped_seqs, now_text, skills, files_modified,"
                " files_read, carried_seqs FROM checkpoints WHERE checkpoint_id=%s",
                (checkpoint_id,))
            row = await cur.fetchone()
        return PreviousCheckpoint(**row) if row else None

    async def _write_files(self, session_id: str, mind: str, memo: str) -> None:
        """The two scratch files into the workspace store, applied every time (no op id):
        each round restores them from the database first, on whichever worker runs it."""
        store = self.session.store
        await store.write(session_id, MIND_FILE, mind.encode())
        await store.write(session_id, MEMO_FILE, memo.encode())

    async def _read_file(self, session_id: str, rel: str) -> str:
        stored = await self.session.store.read(session_id, rel)
        return stored.data.decode("utf-8", errors="replace") if stored else ""

    # ----- 1. write the two files -------------------------------------------------------

    @activity.defn
    async def prepare_checkpoint(self, data: PrepareInput) -> PrepareResult:
        async with await self.session._conn() as conn:
            done = await (await conn.execute(
                "SELECT cut_seq, jsonb_array_length(candidates) FROM checkpoint_attempts"
                " WHERE attempt_id=%s", (data.attempt_id,))).fetchone()
            if done:
                return PrepareResult(ok=True, cut_seq=done[0], candidates=done[1])
            budgets = data.budgets()
            window = await self.session.load_window(conn, data.session_id, data.window_start_seq,
                                                    data.upto_seq, data.checkpoint_id,
                                                    data.instructions)
            live = [r for r in window.rows if r.seq >= data.window_start_seq]
            # The turn is shown what the request it interrupts showed: old tool outputs
            # shrunk by the pre-pass (and so the same, cached, prefix).
            shown_rows = prepass(window.rows, keep_recent_seq=data.turn_first_seq).rows
            previous = await self._previous(conn, data.checkpoint_id)
            previous_mind = previous.mind_text if previous else MindDocument.template().text
            cut = choose_cut(live, budgets.recent_tail, max_fraction=data.portion)
            if cut is None:
                return PrepareResult(ok=False, reason="nothing in the window can move out")
            kept_rows = await self._kept_rows(conn, data.session_id, previous)
            tools = await self.session.session_tools(data.session_id, data.agent,
                                                     data.mcp_tools)
            reply_room = checkpoint_reply_room(data.window.context_window,
                                               data.window.max_output_tokens)

            def turn(at: int) -> tuple[list[MemoCandidate], str, list[int]]:
                moving = [r for r in live if r.seq < at]
                candidates = memo_candidates(kept_rows, moving)
                in_turn = sorted({r.seq for r in moving if r.type == MessageType.USER
                                  and r.seq >= data.turn_first_seq}
                                 | {s for s in (previous.carried_seqs if previous else [])
                                    if s >= data.turn_first_seq})
                checklist = render_checklist(candidates)
                instruction = checkpoint_instruction(
                    mind_path=MIND_FILE, memo_path=MEMO_FILE, mind_text=previous_mind,
                    checklist_text=checklist, budgets=budgets, user_name=data.user_name,
                    in_turn_user_seqs=in_turn)
                return candidates, instruction, in_turn

            def size(shown: list[RecordRow], instruction: str) -> int:
                raw = estimate_tokens(window.system, shown, [
                    window.checkpoint_text or "", REQUEST_MARKER, instruction], tools=tools)
                return int(raw * max(data.usage_ratio, 0.5)) + reply_room

            candidates, instruction, in_turn = turn(cut)
            view, omit_seq = CheckpointView.EARLIER, None
            if data.portion >= 1.0:
                newest = newest_tool_output(live)
                room = data.window.context_window
                full = size(shown_rows, instruction)
                without = size(leave_out_output(shown_rows, newest.seq), instruction) \
                    if newest is not None and full > room else None
                earlier: list[tuple[int, int]] = []
                if full > room and (without is None or without > room):
                    for at in (b for b in cut_boundaries(live) if b <= cut):
                        earlier.append((at, size([r for r in shown_rows if r.seq < at],
                                                 turn(at)[1])))
                view, earlier_cut = checkpoint_view(full, without, earlier, room)
                activity.logger.info("checkpoint view %s: full turn %d, without the newest "
                                     "output %s, window %d", view.value, full, without, room)
                if view is CheckpointView.NONE:
                    return PrepareResult(ok=False,
                                         reason="no earlier part fits a checkpoint turn")
                if view is CheckpointView.WITHOUT_NEWEST_OUTPUT:
                    assert newest is not None
                    omit_seq = newest.seq
                if view is CheckpointView.EARLIER:
                    assert earlier_cut is not None
                    cut = earlier_cut
                    candidates, instruction, in_turn = turn(cut)
                    total = max(1, sum(r.token_count for r in live))
                    shown_share = sum(r.token_count for r in live if r.seq < cut) / total
                    data = data.model_copy(update={"portion": min(0.99, round(shown_share, 2))})
            data = data.model_copy(update={"view": view.value, "omit_seq": omit_seq})
            checklist = render_checklist(candidates)
            await self._write_files(data.session_id, previous_mind, checklist)
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
            return PrepareResult(ok=True, cut_seq=cut, candidates=len(candidates),
                                 view=view.value)

    async def _kept_rows(self, conn: AsyncConnection, session_id: str,
                         previous: PreviousCheckpoint | None) -> list[RecordRow]:
        # Kept messages the budget left in the record are still kept: offered ticked again.
        kept_seqs = sorted({int(e["seq"]) for e in (previous.memo if previous else [])}
                           | set(previous.memo_dropped_seqs if previous else []))
        return await load_seqs(conn, session_id, kept_seqs)

    async def _candidates(self, conn: AsyncConnection, session_id: str,
                          previous: PreviousCheckpoint | None,
                          moving: list[RecordRow]) -> list[MemoCandidate]:
        return memo_candidates(await self._kept_rows(conn, session_id, previous), moving)

    async def _attempt(self, conn: AsyncConnection, attempt_id: str) -> dict[str, Any]:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute("SELECT * FROM checkpoint_attempts WHERE attempt_id=%s",
                              (attempt_id,))
            row = await cur.fetchone()
        if row is None:
            raise ApplicationError(f"no checkpoint attempt {attempt_id}", non_retryable=True)
        return row

    async def _candidate_texts(self, conn: AsyncConnection,
                               attempt: dict[str, Any]) -> list[MemoCandidate]:
        meta = {int(c["seq"]): c for c in attempt["candidates"]}
        rows = await load_seqs(conn, attempt["session_id"], list(meta))
        return [MemoCandidate(seq=r.seq, text=r.text, tokens=r.token_count,
                              kept_before=bool(meta[r.seq].get("kept_before")))
                for r in rows]

    # ----- 2. one bounded round of the checkpoint turn ----------------------------------

    @activity.defn
    async def checkpoint_round(self, data: RoundInput) -> RoundResult:
        async with await self.session._conn() as conn:
            attempt = await self._attempt(conn, data.attempt_id)
            meta = _meta(attempt)
            rounds: list[dict[str, Any]] = attempt["rounds"][1:]
            if len(rounds) > data.round_no:  # this round already ran: report it again
                done_round = rounds[data.round_no]
                return RoundResult(done=not done_round["results"],
                                   tool_calls=len(done_round["results"]))
            request = await self._round_request(conn, attempt, meta, meta.budgets(), rounds,
                                                data)
            message = await with_heartbeat(create_message(self.settings.model, request))
            blocks = [b.model_dump(mode="json", exclude_none=True) for b in message.content]
            blocks = [b for b in blocks if b.get("type") in ("text", "tool_use")]
            session_id = attempt["session_id"]
            # The files as the previous round left them, from the database: a retried round
            # starts from the same text (edits are never applied twice), on any worker.
            mind_text, memo_text = _files_state(attempt)
            await self._write_files(session_id, mind_text, memo_text)
            ctx = ToolContext(session_id=session_id, store=self.session.store,
                              skills=await self.session.skills(), conn=conn,
                              upto_seq=attempt["upto_seq"], editable={MIND_FILE, MEMO_FILE})
            results = []
            for block in blocks:
                if block["type"] != "tool_use":
                    continue
                if block["name"] in CHECKPOINT_TOOL_NAMES:
                    output = await execute_tool(ctx, block["name"], block.get("input") or {})
                    content, is_error = output.text, output.is_error
                else:
                    content, is_error = CHECKPOINT_REFUSAL.format(name=block["name"]), True
                results.append({"type": "tool_result", "tool_use_id": block["id"],
                                "content": content, "is_error": is_error})
            text = "\n".join(b["text"] for b in blocks if b["type"] == "text")
            entry = {"prompt": self._round_prompt(attempt, data), "assistant": blocks,
                     "results": results,
                     "files": {"mind": await self._read_file(session_id, MIND_FILE),
                               "memo": await self._read_file(session_id, MEMO_FILE)}}
            await conn.execute(
                "UPDATE checkpoint_attempts SET rounds = rounds || %s::jsonb,"
                " rounds_used = rounds_used + 1,"
                " final_text = CASE WHEN %s THEN %s ELSE final_text END WHERE attempt_id=%s",
                (json.dumps([entry]), not results, text, data.attempt_id))
            return RoundResult(done=not results, tool_calls=len(results))

    async def _conversation(self, conn: AsyncConnection, attempt: dict[str, Any],
                            meta: PrepareInput) -> tuple[LoadedWindow, list[dict[str, Any]]]:
        """The session's window and conversation as this attempt's turn sees them: the
        prefix every request of the attempt (the memory flush, the rounds) shares."""
        window = await self.session.load_window(
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

    async def flush_request(self, attempt_id: str, instruction: str,
                            max_tokens: int) -> dict[str, Any]:
        """The memory flush's request for a prepared attempt: the same tools, system prompt
        and conversation prefix as the checkpoint turn after it (so both read it from the
        prompt cache), then `instruction`."""
        async with await self.session._conn() as conn:
            attempt = await self._attempt(conn, attempt_id)
            meta = _meta(attempt)
            window, messages = await self._conversation(conn, attempt, meta)
        conversation_end = len(messages)
        _append_user(messages, [{"type": "text", "text": instruction}])
        system, messages = with_cache_breakpoints(
            window.system, messages, checkpoint_text=window.checkpoint_text,
            stable_end=conversation_end)
        return {
            "model": meta.model,
            "max_tokens": min(max_tokens, checkpoint_reply_room(
                meta.window.context_window, meta.window.max_output_tokens)),
            "system": system, "messages": messages,
            "tools": await self.session.session_tools(meta.session_id, meta.agent,
                                                      meta.mcp_tools),
        }

    async def _round_request(self, conn: AsyncConnection, attempt: dict[str, Any],
                             meta: PrepareInput, budgets: CheckpointBudgets,
                             rounds: list[dict[str, Any]], data: RoundInput) -> dict[str, Any]:
        window, messages = await self._conversation(conn, attempt, meta)
        conversation_end = len(messages)
        instruction = REQUEST_MARKER + "\n" + checkpoint_instruction(
            mind_path=attempt["mind_path"], memo_path=attempt["memo_path"],
            mind_text=attempt["previous_mind"], checklist_text=attempt["checklist_original"],
            budgets=budgets, user_name=meta.user_name,
            in_turn_user_seqs=list(attempt["in_turn_user_seqs"]))
        _append_user(messages, [{"type": "text", "text": instruction}])
        for past in rounds:
            if past.get("prompt"):
                _append_user(messages, [{"type": "text", "text": past["prompt"]}])
            messages.append({"role": "assistant", "content": past["assistant"]})
            if past["results"]:
                _append_user(messages, past["results"])
        prompt = self._round_prompt(attempt, data)
        if prompt:
            _append_user(messages, [{"type": "text", "text": prompt}])
        # The same tools, system prompt and conversation prefix as the request it follows,
        # so the turn reads them from the cache; its limits are enforced on the calls.
        system, messages = with_cache_breakpoints(
            window.system, messages, checkpoint_text=window.checkpoint_text,
            stable_end=conversation_end)
        request: dict[str, Any] = {
            "model": meta.model,
            "max_tokens": checkpoint_reply_room(meta.window.context_window,
                                                meta.window.max_output_tokens),
            "system": system, "messages": messages,
            "tools": await self.session.session_tools(meta.session_id, meta.agent,
                                                      meta.mcp_tools),
        }
        if data.final:
            request["tool_choice"] = {"type": "none"}
        return request

    def _round_prompt(self, attempt: dict[str, Any], data: RoundInput) -> str | None:
        """Keel's words before this round: the repair request, or the last-round note."""
        if data.repair:
            problems = [Problem(**p) for p in attempt["problems"]]
            return repair_request(problems, mind_path=attempt["mind_path"],
                                  memo_path=attempt["memo_path"])
        return FINAL_ROUND_NOTE if data.final else None

    # ----- 3. the checks ----------------------------------------------------------------

    async def _check(self, conn: AsyncConnection, attempt: dict[str, Any],
                     budgets: CheckpointBudgets) -> CheckpointCheck:
        mind_text, memo_text = _files_state(attempt)
        return validate_checkpoint(
            final_text=attempt["final_text"] or "",
            mind=MindDocument(text=mind_text),
            previous_mind=MindDocument(text=attempt["previous_mind"]),
            checklist_original=attempt["checklist_original"],
            checklist_edited=memo_text,
            candidates=await self._candidate_texts(conn, attempt),
            budgets=budgets,
        )

    @activity.defn
    async def validate_checkpoint(self, attempt_id: str) -> CheckResult:
        async with await self.session._conn() as conn:
            attempt = await self._attempt(conn, attempt_id)
            check = await self._check(conn, attempt, _meta(attempt).budgets())
            await conn.execute(
                "UPDATE checkpoint_attempts SET problems=%s, repair_sent = repair_sent OR %s"
                " WHERE attempt_id=%s",
                (json.dumps([p.model_dump() for p in check.problems]), bool(check.problems),
                 attempt_id))
            return CheckResult(problems=check.problems)

    # ----- 4. assemble and store --------------------------------------------------------

    @activity.defn
    async def store_checkpoint(self, data: StoreInput) -> StoreResult:
        checkpoint_id = checkpoint_id_for(data.attempt_id)
        async with await self.session._conn() as conn:
            stored = await self._stored(conn, checkpoint_id)
            if stored:
                return stored
            attempt = await self._attempt(conn, data.attempt_id)
            meta = _meta(attempt)
            if data.abort_reason:
                return await self._fail(conn, data.attempt_id, data.abort_reason)
            budgets = meta.budgets()
            check = await self._check(conn, attempt, budgets)
            full_copy = full_mind_file(data.attempt_id.rsplit(":a", 1)[-1])
            outcome = resolve_checkpoint(
                check=check, mind=MindDocument(text=_files_state(attempt)[0]),
                previous_mind=MindDocument(text=attempt["previous_mind"]),
                candidates=await self._candidate_texts(conn, attempt),
                memo_untouched_rounds_exhausted=data.rounds_exhausted, budgets=budgets,
                full_mind_path=full_copy)
            if outcome.failed:
                return await self._fail(conn, data.attempt_id, outcome.reason or "no usable now")
            if outcome.mind_context_text != outcome.mind_record_text:
                # Read-only to the agent: it lies in Keel's own folder (activities.tools).
                await self.session.store.write(meta.session_id, full_copy,
                                               outcome.mind_record_text.encode(),
                                               op_id=f"full-mind:{data.attempt_id}")
            previous = await self._previous(conn, meta.checkpoint_id)
            return await self._store(
                conn, kind="model", checkpoint_id=checkpoint_id, session_id=meta.session_id,
                record_seq=data.record_seq, window_start=meta.window_start_seq,
                cut=attempt["cut_seq"], upto=meta.upto_seq, budgets=budgets,
                mind_record=outcome.mind_record_text, mind_context=outcome.mind_context_text,
                memo=outcome.memo, now_text=_as_of(outcome.now_text or "", meta,
                                                   attempt["cut_seq"]),
                previous=previous,
                previous_id=meta.checkpoint_id, keep_recent_seq=meta.turn_first_seq,
                carried=list(attempt["in_turn_user_seqs"]), fallbacks=list(outcome.fallbacks),
                user_name=meta.user_name, attempt_id=data.attempt_id)

    async def _fail(self, conn: AsyncConnection, attempt_id: str, reason: str) -> StoreResult:
        await conn.execute(
            "UPDATE checkpoint_attempts SET outcome='failed', failure_reason=%s"
            " WHERE attempt_id=%s", (reason, attempt_id))
        activity.logger.warning("checkpoint %s failed: %s", attempt_id, reason)
        return StoreResult(stored=False, reason=reason)

    async def _stored(self, conn: AsyncConnection, checkpoint_id: str) -> StoreResult | None:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(
                "SELECT cut_seq, fallbacks, mind_context_text, memo, memo_dropped_seqs,"
                " now_text, tokens_moved_out, window_tokens_before, window_tokens_after"
                " FROM checkpoints WHERE checkpoint_id=%s", (checkpoint_id,))
            row = await cur.fetchone()
        if row is None:
            return None
        memo = MemoAssembly.model_validate({"entries": row["memo"],
                                            "dropped_seqs": row["memo_dropped_seqs"]})
        return StoreResult(stored=True, checkpoint_id=checkpoint_id, cut_seq=row["cut_seq"],
                           fallbacks=row["fallbacks"], mind_text=row["mind_context_text"],
                           memo_text=memo.render(), now_text=row["now_text"],
                           window_tokens_after=row["window_tokens_after"],
                           tokens_saved=max(0, row["window_tokens_before"]
                                            - row["window_tokens_after"]),
                           tokens_moved_out=row["tokens_moved_out"])

    async def _context_tokens(self, conn: AsyncConnection, session_id: str, start: int,
                              upto: int, checkpoint_id: str | None,
                              checkpoint_text: str | None, keep_recent_seq: int) -> int:
        """The next request's size, measured as call_model measures it (the pre-pass
        applied), so before and after compare like with like."""
        window = await self.session.load_window(conn, session_id, start, upto, checkpoint_id)
        text = checkpoint_text if checkpoint_text is not None else window.checkpoint_text
        rows = prepass(window.rows, keep_recent_seq=keep_recent_seq).rows
        return estimate_tokens(window.system, rows, [text or ""])

    async def _store(self, conn: AsyncConnection, *, kind: str, checkpoint_id: str,
                     session_id: str, record_seq: int, window_start: int, cut: int, upto: int,
                     budgets: CheckpointBudgets, mind_record: str, mind_context: str,
                     memo: MemoAssembly, now_text: str, previous: PreviousCheckpoint | None,
                     previous_id: str | None,
                     carried: list[int], fallbacks: list[str], user_name: str,
                     attempt_id: str, keep_recent_seq: int) -> StoreResult:
        moving = await load_rows(conn, session_id, window_start, cut - 1)
        skills = self._carried_skills(moving, previous, budgets, await self.session.skills())
        files = recent_files(moving,
                             modified_before=previous.files_modified if previous else [],
                             read_before=previous.files_read if previous else [],
                             budgets=budgets)
        rendered = render_checkpoint(
            mind_text=mind_context, memo=memo, now_text=now_text, skills=skills,
            files_modified=files.modified, files_read=files.read,
            files_pushed_out=files.pushed_out, record_hint=record_hint(session_id, cut),
            in_turn_user_seqs=carried, user_name=user_name)
        moved_tokens = sum(r.token_count for r in moving)
        before = await self._context_tokens(conn, session_id, window_start, upto,
                                            previous_id, None, keep_recent_seq)
        carried_rows = await load_seqs(conn, session_id, [s for s in carried if s < cut])
        after_rows = prepass(carried_rows + await load_rows(conn, session_id, cut, upto),
                             keep_recent_seq=keep_recent_seq).rows
        after = estimate_tokens(await self.session.system_prompt(session_id), after_rows,
                                [rendered])
        async with conn.transaction():
            await insert_row(conn, NewRow(
                session_id=session_id, seq=record_seq, input_id=f"checkpoint-{checkpoint_id}",
                type=MessageType.CHECKPOINT, text=rendered,
                content={"checkpoint_id": checkpoint_id, "kind": kind, "cut_seq": cut}))
            await conn.execute(
                "INSERT INTO checkpoints (checkpoint_id, session_id, kind, record_seq, cut_seq,"
                " mind_text, mind_context_text, memo, memo_dropped_seqs, now_text, skills,"
                " files_modified, files_read, fallbacks, rendered, rendered_tokens,"
                " tokens_moved_out, carried_seqs, upto_seq, window_tokens_before,"
                " window_tokens_after) VALUES"
                " (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
                " ON CONFLICT (checkpoint_id) DO NOTHING",
                (checkpoint_id, session_id, kind, record_seq, cut, mind_record, mind_context,
                 json.dumps([e.model_dump() for e in memo.entries]),
                 json.dumps(memo.dropped_seqs), now_text,
                 json.dumps([s.model_dump() for s in skills]), json.dumps(files.modified),
                 json.dumps(files.read), json.dumps(fallbacks), rendered, count_tokens(rendered),
                 moved_tokens, json.dumps(carried), upto, before, after))
            await conn.execute(
                "UPDATE checkpoint_attempts SET outcome='stored' WHERE attempt_id=%s",
                (attempt_id,))
        activity.logger.info("checkpoint %s stored: moved %d tokens, fallbacks %s",
                             checkpoint_id, moved_tokens, fallbacks)
        stored = await self._stored(conn, checkpoint_id)
        assert stored is not None
        return stored

    def _carried_skills(self, moving: list[RecordRow], previous: PreviousCheckpoint | None,
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

    # ----- the move-half path: no model -------------------------------------------------

    @activity.defn
    async def move_earliest_half(self, data: MoveInput) -> StoreResult:
        checkpoint_id = checkpoint_id_for(data.attempt_id)
        async with await self.session._conn() as conn:
            stored = await self._stored(conn, checkpoint_id)
            if stored:
                return stored
            budgets = data.budgets()
            window = await self.session.load_window(conn, data.session_id, data.window_start_seq,
                                                    data.upto_seq, data.checkpoint_id)
            live = [r for r in window.rows if r.seq >= data.window_start_seq]
            half = sum(r.token_count for r in live) // 2
            cut = choose_cut(live, half)
            if cut is None:
                return StoreResult(stored=False, reason="nothing left to move out")
            previous = await self._previous(conn, data.checkpoint_id)
            moving = [r for r in live if r.seq < cut]
            candidates = await self._candidates(conn, data.session_id, previous, moving)
            memo = assemble_memo(candidates, budgets)  # every user message that moves out
            mind = previous.mind_text if previous else MindDocument.template().text
            now_text = previous.now_text if previous else ""
            carried = sorted({r.seq for r in moving if r.type == MessageType.USER
                              and r.seq >= data.turn_first_seq}
                             | {s for s in (previous.carried_seqs if previous else [])
                                if s >= data.turn_first_seq})
            return await self._store(
                conn, kind="move_half", checkpoint_id=checkpoint_id, session_id=data.session_id,
                record_seq=data.record_seq, window_start=data.window_start_seq, cut=cut,
                upto=data.upto_seq, budgets=budgets, mind_record=mind, mind_context=mind,
                memo=memo, now_text=now_text, previous=previous, carried=carried,
                previous_id=data.checkpoint_id, keep_recent_seq=data.turn_first_seq,
                fallbacks=["moved the earliest half out without the model", *memo.fallbacks],
                user_name=data.user_name, attempt_id=data.attempt_id)


def _as_of(now_text: str, meta: PrepareInput, cut_seq: int) -> str:
    """A checkpoint over the earlier half saw only that half: its now is dated, so the
    newer messages that follow it verbatim win where the two differ."""
    if meta.portion >= 1.0:
        return now_text
    return (f"(Written over messages up to #{cut_seq - 1} only; the messages after it, "
            f"kept word for word below, are newer and win where they differ.)\n{now_text}")


def _meta(attempt: dict[str, Any]) -> PrepareInput:
    """The attempt's own input, stored by prepare as the first entry of its rounds."""
    return PrepareInput.model_validate(attempt["rounds"][0]["meta"])


def _files_state(attempt: dict[str, Any]) -> tuple[str, str]:
    """(mind, memo) as the newest round left them; the originals before any round."""
    for past in reversed(attempt["rounds"][1:]):
        if past.get("files"):
            return past["files"]["mind"], past["files"]["memo"]
    return attempt["previous_mind"], attempt["checklist_original"]


def _append_user(messages: list[dict[str, Any]], blocks: list[dict[str, Any]]) -> None:
    if messages and messages[-1]["role"] == "user":
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": "user", "content": list(blocks)})
