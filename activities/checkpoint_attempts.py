"""A checkpoint attempt's record: what the steps read back and write beside the rows.

Every step is keyed by its attempt id: `checkpoint_attempts` holds what prepare chose (its
input first among the rounds, `meta`), each round's entry and the files as it left them
(`files_state`), the problems found; `checkpoints` holds what was stored (`stored`). The
two scratch files live in the workspace store, and are written back from the database
before each round (`write_files`), on whichever worker runs it.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.checkpoint_payloads import PrepareInput, PreviousCheckpoint, StoreResult
from activities.record import load_seqs
from activities.workspace import WorkspaceStore
from schemas.checkpoint.memo import MemoAssembly, MemoCandidate, memo_candidates
from schemas.checkpoint.request import MEMO_FILE, MIND_FILE
from schemas.messages import RecordRow

__all__ = [
    "attempt", "candidate_texts", "candidates", "fail", "files_state", "kept_rows", "meta",
    "previous", "read_file", "stored", "write_files",
]


async def previous(conn: AsyncConnection,
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


async def write_files(store: WorkspaceStore, session_id: str, mind: str, memo: str) -> None:
    """The two scratch files into the workspace store, applied every time (no op id):
    each round restores them from the database first, on whichever worker runs it."""
    await store.write(session_id, MIND_FILE, mind.encode())
    await store.write(session_id, MEMO_FILE, memo.encode())


async def read_file(store: WorkspaceStore, session_id: str, rel: str) -> str:
    found = await store.read(session_id, rel)
    return found.data.decode("utf-8", errors="replace") if found else ""


async def kept_rows(conn: AsyncConnection, session_id: str,
                    before: PreviousCheckpoint | None, turn_first_seq: int) -> list[RecordRow]:
    """The messages offered ticked: those the memo kept (the budget may have left some in
    the record only: still kept), and those carried as their turn's request whose turn is
    over (before `turn_first_seq`): they leave the carried set only through the memo."""
    kept_seqs = sorted({int(e["seq"]) for e in (before.memo if before else [])}
                       | set(before.memo_dropped_seqs if before else [])
                       | {s for s in (before.carried_seqs if before else [])
                          if s < turn_first_seq})
    return await load_seqs(conn, session_id, kept_seqs)


async def candidates(conn: AsyncConnection, session_id: str,
                     before: PreviousCheckpoint | None, moving: list[RecordRow],
                     turn_first_seq: int) -> list[MemoCandidate]:
    return memo_candidates(await kept_rows(conn, session_id, before, turn_first_seq), moving,
                           in_turn_from=turn_first_seq)


async def attempt(conn: AsyncConnection, attempt_id: str) -> dict[str, Any]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute("SELECT * FROM checkpoint_attempts WHERE attempt_id=%s",
                          (attempt_id,))
        row = await cur.fetchone()
    if row is None:
        raise ApplicationError(f"no checkpoint attempt {attempt_id}", non_retryable=True)
    return row


async def candidate_texts(conn: AsyncConnection,
                          found: dict[str, Any]) -> list[MemoCandidate]:
    by_seq = {int(c["seq"]): c for c in found["candidates"]}
    rows = await load_seqs(conn, found["session_id"], list(by_seq))
    return [MemoCandidate(seq=r.seq, text=r.text, tokens=r.token_count,
                          kept_before=bool(by_seq[r.seq].get("kept_before")))
            for r in rows]


def meta(found: dict[str, Any]) -> PrepareInput:
    """The attempt's own input, stored by prepare as the first entry of its rounds."""
    return PrepareInput.model_validate(found["rounds"][0]["meta"])


def files_state(found: dict[str, Any]) -> tuple[str, str]:
    """(mind, memo) as the newest round left them; the originals before any round."""
    for past in reversed(found["rounds"][1:]):
        if past.get("files"):
            return past["files"]["mind"], past["files"]["memo"]
    return found["previous_mind"], found["checklist_original"]


async def fail(conn: AsyncConnection, attempt_id: str, reason: str) -> StoreResult:
    await conn.execute(
        "UPDATE checkpoint_attempts SET outcome='failed', failure_reason=%s"
        " WHERE attempt_id=%s", (reason, attempt_id))
    activity.logger.warning("checkpoint %s failed: %s", attempt_id, reason)
    return StoreResult(stored=False, reason=reason)


async def stored(conn: AsyncConnection, checkpoint_id: str) -> StoreResult | None:
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
