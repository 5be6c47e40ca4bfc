"""Branching a session in the database: a fork's copy and a rewind's marks, each one
transaction (schemas.branch has the rules: which point, which checkpoint, which rows).

Invariants:
- A fork is all or nothing: the new session's row, its copied rows (each with its
  provenance: `origin_session`, `origin_seq`), its checkpoint and its workspace, and the
  request id that made it (`branch_requests`) commit together, or nothing does. A retry
  with the same request id returns what the first made; another request may not take an
  existing session's id. The origin is only read.
- A rewind deletes nothing: the rows after the point get `rewound_by` (every window load
  skips them, activities.record), the workspace gets back the versions it had at the
  point as new versions (its history keeps the abandoned ones), and the rewind is a row
  of `session_rewinds`; retried with the same id it marks nothing more.
- What the rewound rows said leaves long memory: in the same transaction, a session with
  a memory scope queues their daily-note entries to go (a `forget` row of the transcript
  outbox, activities.vault.outbox), so no recall or memory search brings the abandoned
  branch back; a transcript not written yet never writes them. The cards a rollup or a
  flush already drew from them are the scope's knowledge and stay.
- "The workspace at a point" is each file's newest version written at or before the
  point's row was recorded (`workspace_file_versions`, kept by the database, migration
  006). Only the PostgreSQL store keeps versions: with the local store a branch copies or
  restores nothing of the workspace and says so (`workspace_versions: false`).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.context import SessionContext
from activities.heartbeat import with_heartbeat
from activities.vault.outbox import QueuedTranscript, queue_transcript
from schemas.branch import (
    BRANCH_REFUSED,
    BranchCheckpoint,
    ForkCopy,
    ForkDone,
    RewindDone,
    RewindInput,
    checkpoint_at,
    copy_plan,
    point_problem,
    renamed_checkpoint,
    round_problem,
    state_at,
    tool_call_ids,
)
from schemas.checkpoint.memo import MemoAssembly
from schemas.config import WorkspaceStoreKind, vault_queue
from schemas.session import session_id_problem
from schemas.uploads import STAGING

__all__ = ["BranchActivities", "check_point", "fork_copy", "live_checkpoints",
           "rewind_marks"]

LOCK_TIMEOUT = "5s"  # a branch waits this long for a lock, then fails (and is retried)


def refused(message: str) -> ApplicationError:
    return ApplicationError(message, type=BRANCH_REFUSED, non_retryable=True)


async def live_checkpoints(conn: AsyncConnection, session_id: str) -> list[BranchCheckpoint]:
    """The session's checkpoints whose recap row is live, oldest first."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "SELECT c.checkpoint_id, c.record_seq, c.cut_seq, c.carried_seqs,"
            " c.mind_context_text, c.memo, c.memo_dropped_seqs, c.now_text,"
            " c.window_tokens_after FROM checkpoints c JOIN messages m"
            " ON m.session_id = c.session_id AND m.seq = c.record_seq"
            " WHERE c.session_id = %s AND m.rewound_by IS NULL ORDER BY c.record_seq",
            (session_id,))
        rows = await cur.fetchall()
    return [BranchCheckpoint(
        checkpoint_id=r["checkpoint_id"], record_seq=r["record_seq"], cut_seq=r["cut_seq"],
        carried_seqs=r["carried_seqs"], mind_text=r["mind_context_text"],
        memo_text=MemoAssembly.model_validate({"entries": r["memo"],
                                               "dropped_seqs": r["memo_dropped_seqs"]}
                                              ).render(),
        now_text=r["now_text"], window_tokens_after=r["window_tokens_after"]) for r in rows]


async def check_point(conn: AsyncConnection, session_id: str, point: int) -> datetime:
    """Refuse a point that is no branch point (schemas.branch); the time its row was
    recorded, which says which file versions were current there."""
    last = await (await conn.execute(
        "SELECT coalesce(max(seq), 0) FROM messages WHERE session_id = %s",
        (session_id,))).fetchone()
    assert last is not None
    if problem := point_problem(point, int(last[0])):
        raise refused(problem)
    row = await (await conn.execute(
        "SELECT created_at, rewound_by FROM messages WHERE session_id = %s AND seq <= %s"
        " ORDER BY seq DESC LIMIT 1", (session_id, point))).fetchone()
    assert row is not None
    if row[1] is not None:
        raise refused(f"seq {point} was abandoned by a rewind ({row[1]}); pick a seq that "
                      "was not rewound")
    assistant = await (await conn.execute(
        "SELECT seq, content FROM messages WHERE session_id = %s AND seq <= %s"
        " AND type = 'assistant' AND rewound_by IS NULL ORDER BY seq DESC LIMIT 1",
        (session_id, point))).fetchone()
    if assistant is not None:
        results = await (await conn.execute(
            "SELECT content->>'tool_use_id' FROM messages WHERE session_id = %s"
            " AND seq > %s AND seq <= %s AND type = 'tool_result' AND rewound_by IS NULL",
            (session_id, assistant[0], point))).fetchall()
        if problem := round_problem(point, int(assistant[0]), tool_call_ids(assistant[1]),
                                    [r[0] for r in results if r[0]]):
            raise refused(problem)
    at: datetime = row[0]
    return at


async def _turn_at(conn: AsyncConnection, session_id: str, point: int) -> int:
    row = await (await conn.execute(
        "SELECT coalesce(max(turn), 0) FROM messages WHERE session_id = %s AND seq <= %s"
        " AND rewound_by IS NULL", (session_id, point))).fetchone()
    return int(row[0]) if row else 0


_COPY_ROWS = (
    "INSERT INTO messages (session_id, seq, input_id, type, source_line, content_text,"
    " content, token_count, turn, created_at, origin_session, origin_seq)"
    " SELECT %(new)s, seq, input_id, type, source_line, content_text, content, token_count,"
    " turn, created_at, %(origin)s, seq FROM messages WHERE session_id = %(origin)s"
    " AND rewound_by IS NULL AND (seq BETWEEN %(from)s AND %(upto)s OR seq = ANY(%(carried)s))"
    " ORDER BY seq")

_COPY_CHECKPOINT = (
    "INSERT INTO checkpoints (checkpoint_id, session_id, kind, record_seq, cut_seq, upto_seq,"
    " mind_text, mind_context_text, memo, memo_dropped_seqs, now_text, skills,"
    " files_modified, files_read, fallbacks, rendered, rendered_tokens, tokens_moved_out,"
    " window_tokens_before, window_tokens_after, carried_seqs, created_at)"
    " SELECT %(new_id)s, %(new)s, kind, record_seq, cut_seq, upto_seq, mind_text,"
    " mind_context_text, memo, memo_dropped_seqs, now_text, skills, files_modified,"
    " files_read, fallbacks, rendered, rendered_tokens, tokens_moved_out,"
    " window_tokens_before, window_tokens_after, carried_seqs, created_at"
    " FROM checkpoints WHERE checkpoint_id = %(old_id)s")

# Each file's newest version at or before a time (a deletion: data NULL).
_FILES_AT = (
    "SELECT DISTINCT ON (path) path, version, data, size, written_at"
    " FROM workspace_file_versions WHERE scope = %(scope)s AND written_at <= %(at)s"
    " ORDER BY path, id DESC")


async def _copy_workspace(conn: AsyncConnection, origin: str, new: str,
                          at: datetime) -> int:
    """The origin's file history up to `at` into `new`, and its files as they were then."""
    await conn.execute("SELECT set_config('keel.branch_copy', 'on', true)")
    await conn.execute(
        "INSERT INTO workspace_file_versions (scope, path, version, data, size, written_at)"
        " SELECT %(new)s, path, version, data, size, written_at FROM workspace_file_versions"
        " WHERE scope = %(scope)s AND written_at <= %(at)s ORDER BY id",
        {"new": new, "scope": origin, "at": at})
    cur = await conn.execute(
        "INSERT INTO workspace_files (scope, path, version, data, size, updated_at)"
        f" SELECT %(new)s, path, version, data, size, written_at FROM ({_FILES_AT}) v"
        " WHERE v.data IS NOT NULL", {"new": new, "scope": origin, "at": at})
    await conn.execute("SELECT set_config('keel.branch_copy', 'off', true)")
    return cur.rowcount


async def _rename_checkpoint_rows(conn: AsyncConnection, origin: str, new: str) -> None:
    """The copied recap rows name the fork's checkpoint ids (ids are unique)."""
    rows = await (await conn.execute(
        "SELECT seq, content FROM messages WHERE session_id = %s AND type = 'checkpoint'",
        (new,))).fetchall()
    for seq, content in rows:
        if not isinstance(content, dict) or "checkpoint_id" not in content:
            continue
        renamed = renamed_checkpoint(str(content["checkpoint_id"]), origin, new)
        await conn.execute(
            "UPDATE messages SET input_id = %s, content = %s WHERE session_id = %s"
            " AND seq = %s", (f"checkpoint-{renamed}",
                              json.dumps({**content, "checkpoint_id": renamed}), new, seq))


async def fork_copy(conn: AsyncConnection, data: ForkCopy, *, versions: bool) -> ForkDone:
    """The fork, in the caller's transaction (see the module docstring)."""
    done = await (await conn.execute(
        "SELECT kind, session_id, result FROM branch_requests WHERE request_id = %s",
        (data.request_id,))).fetchone()
    if done is not None:
        if (done[0], done[1]) != ("fork", data.new_session):
            raise refused(f"request {data.request_id} made {done[0]} {done[1]}, not a fork "
                          f"{data.new_session}")
        return ForkDone.model_validate(done[2])
    if problem := session_id_problem(data.new_session):
        raise refused(f"{problem}; pick another id")
    await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    if await (await conn.execute("SELECT 1 FROM sessions WHERE session_id = %s",
                                 (data.new_session,))).fetchone():
        raise refused(f"session {data.new_session} exists already; pick another id")
    origin_row = await (await conn.execute(
        "SELECT user_name, memory_scope FROM sessions WHERE session_id = %s",
        (data.origin,))).fetchone()
    if origin_row is None:
        raise refused(f"no session {data.origin} in the record")
    checkpoints = await live_checkpoints(conn, data.origin)
    point = await _point(data, checkpoints)
    at = await check_point(conn, data.origin, point)
    chosen = checkpoint_at(checkpoints, point)
    plan = copy_plan(chosen, point)
    await conn.execute(
        "INSERT INTO sessions (session_id, user_name, memory_scope, origin_session,"
        " origin_seq, origin_kind) VALUES (%s, %s, %s, %s, %s, 'fork')",
        (data.new_session, origin_row[0], origin_row[1], data.origin, point))
    copied = await conn.execute(_COPY_ROWS, {
        "new": data.new_session, "origin": data.origin, "from": plan.from_seq,
        "upto": plan.upto, "carried": plan.carried})
    new_id: str | None = None
    if chosen is not None:
        new_id = renamed_checkpoint(chosen.checkpoint_id, data.origin, data.new_session)
        await conn.execute(_COPY_CHECKPOINT, {"new_id": new_id, "new": data.new_session,
                                              "old_id": chosen.checkpoint_id})
        await _rename_checkpoint_rows(conn, data.origin, data.new_session)
    files = await _copy_workspace(conn, data.origin, data.new_session, at) if versions else 0
    origin = data.origin_state
    state = state_at(data.new_session, origin.config, chosen, point,
                     turn=await _turn_at(conn, data.origin, point),
                     checkpoint_count=sum(1 for c in checkpoints if c.record_seq <= point),
                     checkpoint_attempts=origin.checkpoint_attempts, checkpoint_id=new_id)
    state.usage_ratio = origin.usage_ratio
    result = ForkDone(session_id=data.new_session, origin=data.origin, at_seq=point,
                      rows_copied=copied.rowcount, files_copied=files,
                      workspace_versions=versions, checkpoint_id=new_id, state=state)
    await conn.execute(
        "INSERT INTO branch_requests (request_id, kind, session_id, origin_session, at_seq,"
        " result) VALUES (%s, 'fork', %s, %s, %s, %s)",
        (data.request_id, data.new_session, data.origin, point, result.model_dump_json()))
    return result


async def _point(data: ForkCopy, checkpoints: list[BranchCheckpoint]) -> int:
    if data.checkpoint is not None:
        if not 1 <= data.checkpoint <= len(checkpoints):
            raise refused(f"session {data.origin} has {len(checkpoints)} checkpoint(s); "
                          f"there is no checkpoint {data.checkpoint}")
        return checkpoints[data.checkpoint - 1].record_seq
    if data.at_seq is None:
        return data.origin_state.recorded_upto
    return data.at_seq


async def _restore_workspace(conn: AsyncConnection, scope: str, at: datetime) -> int:
    """The scope's files back to their versions at `at`, as new versions. An upload's
    staged parts are not files of the session (no history keeps them): left as they are,
    for the put still to come."""
    args: dict[str, Any] = {"scope": scope, "at": at, "staging": STAGING}
    gone = await conn.execute(
        "DELETE FROM workspace_files f WHERE f.scope = %(scope)s"
        " AND NOT starts_with(f.path, %(staging)s) AND NOT EXISTS"
        f" (SELECT 1 FROM ({_FILES_AT}) t WHERE t.path = f.path AND t.data IS NOT NULL)",
        args)
    back = await conn.execute(
        "INSERT INTO workspace_files (scope, path, version, data, size)"
        " SELECT %(scope)s, t.path, coalesce((SELECT max(v.version) FROM"
        " workspace_file_versions v WHERE v.scope = %(scope)s AND v.path = t.path), 0) + 1,"
        f" t.data, t.size FROM ({_FILES_AT}) t WHERE t.data IS NOT NULL AND NOT EXISTS"
        " (SELECT 1 FROM workspace_files f WHERE f.scope = %(scope)s AND f.path = t.path"
        " AND f.data = t.data) ON CONFLICT (scope, path) DO UPDATE SET"
        " version = workspace_files.version + 1, data = excluded.data,"
        " size = excluded.size, updated_at = now()", args)
    return gone.rowcount + back.rowcount


async def rewind_marks(conn: AsyncConnection, data: RewindInput, *, versions: bool,
                       vault_queue: str | None = None) -> RewindDone:
    """The rewind, in the caller's transaction (see the module docstring); with
    `vault_queue`, the rewound messages' daily-note entries queued to go with it."""
    done = await (await conn.execute(
        "SELECT to_seq, rows_rewound, first_rewound, last_rewound, files_restored"
        " FROM session_rewinds WHERE rewind_id = %s", (data.rewind_id,))).fetchone()
    if done is None and data.check_only:  # refused here before a wait is cancelled
        await check_point(conn, data.session_id, data.to_seq)
        return RewindDone(rewind_id=data.rewind_id, to_seq=data.to_seq, rows_rewound=0,
                          workspace_versions=versions)
    if done is None:
        await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        at = await check_point(conn, data.session_id, data.to_seq)
        marked = await (await conn.execute(
            "UPDATE messages SET rewound_by = %s, rewound_at = now() WHERE session_id = %s"
            " AND seq > %s AND seq <= %s AND rewound_by IS NULL AND NOT seq = ANY(%s)"
            " RETURNING seq", (data.rewind_id, data.session_id, data.to_seq, data.upto_seq,
                               data.keep_seqs))).fetchall()
        seqs = [int(r[0]) for r in marked]
        if seqs and vault_queue is not None:
            await _forget_in_memory(conn, vault_queue, data.session_id, seqs)
        files = await _restore_workspace(conn, data.session_id, at) if versions else 0
        done = (data.to_seq, len(seqs), min(seqs, default=None), max(seqs, default=None),
                files)
        await conn.execute(
            "INSERT INTO session_rewinds (rewind_id, session_id, to_seq, rows_rewound,"
            " first_rewound, last_rewound, files_restored) VALUES (%s,%s,%s,%s,%s,%s,%s)",
            (data.rewind_id, data.session_id, *done))
    checkpoints = [c for c in await live_checkpoints(conn, data.session_id)
                   if c.record_seq <= done[0]]
    return RewindDone(rewind_id=data.rewind_id, to_seq=done[0], rows_rewound=done[1],
                      first_rewound=done[2], last_rewound=done[3], files_restored=done[4],
                      workspace_versions=versions, checkpoint=checkpoint_at(checkpoints,
                                                                            done[0]),
                      checkpoint_count=len(checkpoints))


async def _forget_in_memory(conn: AsyncConnection, vault_queue: str, session_id: str,
                            seqs: list[int]) -> None:
    """The rewound messages' entries queued for the vault worker to take out of the
    session's memory scope (none: no long memory), in the rewind's transaction."""
    scope = await (await conn.execute(
        "SELECT memory_scope FROM sessions WHERE session_id = %s", (session_id,))).fetchone()
    if scope is None or scope[0] is None:
        return
    await queue_transcript(conn, vault_queue, QueuedTranscript(
        session_id=session_id, scope=scope[0], reply_seq=max(seqs), seqs=sorted(seqs),
        recalled=[], forget=True))


class BranchActivities:
    """The fork's copy and the rewind's marks, over the process's session context."""

    def __init__(self, ctx: SessionContext) -> None:
        self.ctx = ctx

    @property
    def _versions(self) -> bool:
        return self.ctx.settings.workspace_store == WorkspaceStoreKind.POSTGRES

    @activity.defn
    async def fork_session(self, data: ForkCopy) -> ForkDone:
        return await with_heartbeat(self._fork(data))  # a lost worker is seen in seconds

    async def _fork(self, data: ForkCopy) -> ForkDone:
        async with await self.ctx.connection() as conn, conn.transaction():
            return await fork_copy(conn, data, versions=self._versions)

    @activity.defn
    async def rewind_session(self, data: RewindInput) -> RewindDone:
        return await with_heartbeat(self._rewind(data))

    async def _rewind(self, data: RewindInput) -> RewindDone:
        async with await self.ctx.connection() as conn, conn.transaction():
            return await rewind_marks(conn, data, versions=self._versions,
                                      vault_queue=vault_queue(activity.info().task_queue))
