"""The transcript outbox: a turn's transcript queued with its reply, drained by the vault.

Invariants:
- A model call that records a reply queues, in the same transaction, one row naming what
  the vault's daily transcript must get from it (the call's inputs, then the reply when it
  has text; the recall's hits, whose access count goes up) and notifies the vault worker
  (`pg_notify`). Either both are in the record or neither: a retried call that finds its
  reply recorded queues nothing again. The session's history holds no transcript activity
  and no workflow task after the reply: the turn is over when its caller has the answer.
- One drainer per vault queue, in the process that holds the vault's lock (workers.worker),
  so the vault keeps its single writer. It takes due rows in id order (a session's entries
  land in the order they were recorded), appends them as `append_transcripts` does
  (idempotent: a row drained twice after a crash appends nothing twice), and deletes them.
  The rows waiting together are written together, a scope at a time (one vault lock, one
  index batch, each day file written once): the one writer's cost a row falls as a busy
  deployment's backlog grows, so the vault keeps up with many session workers.
- A rewind queues a `forget` row in its own transaction (activities.branch): the drainer
  takes the rewound messages' entries out of the daily files and the index
  (`MemoryActivities.forget_rewound`) after the appends it took with it, and an append
  never writes a message rewound before it ran; so the abandoned branch leaves long
  memory whichever came first.
- A write that fails is done again row by row, so only the row at fault waits; a row that
  fails is tried again with backoff; past `MAX_ATTEMPTS` it is said to the
  session (the `transcript_failed` signal: `last_error` and an ErrorEvent where "memory")
  and dropped: the record keeps the messages and the nightly rollup reads the record too.
  Nothing here can hold a turn up: the session never waits on the outbox.
- The drainer wakes on a notification and waits a moment, so the turn whose reply just
  committed completes first: `QUIET_SETTLE_S` after a quiet spell (a person's pace: the
  turn's after-reply work ends within ~20 ms of its reply), `SETTLE_S` while replies come
  fast (woken again within `QUIET_S`), so the replies of the next moments join its write
  (at 20 turns a second a drain takes ~3 rows instead of one, ~a third less of the
  drainer's CPU a row, `bench/bench_transcripts.py`). It sweeps every `SWEEP_S` besides
  (a notification sent while it was reconnecting, a row whose retry came due); a lost
  connection is opened again after a pause, never a crash of the worker.
- Its work is on the process's metrics (workers.metrics): rows written and dropped, and the
  rows waiting (`keel_transcripts_waiting`, read at most every `SWEEP_S`): the one writer
  keeping up, or not, with every session worker.
- Stopping has an end (`activities.tasks.stop_task`, `STOP_GRACE_S` a grace): a drain may
  wait on something of its own while it unwinds from a cancel (psycopg, for one, waits up
  to 10 s for the server to end a cancelled query).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import psycopg
from psycopg import AsyncConnection
from temporalio.runtime import Runtime

from activities.db import Outage, get_pool
from activities.listen import Notifications
from activities.tasks import stop_task
from activities.vault.turn import MemoryActivities, TranscriptsInput
from schemas.metrics import TRANSCRIPTS_DROPPED, TRANSCRIPTS_WAITING, TRANSCRIPTS_WRITTEN

__all__ = ["CHANNEL", "MAX_ATTEMPTS", "QueuedTranscript", "TranscriptDrainer",
           "queue_transcript"]

log = logging.getLogger("keel.transcripts")

CHANNEL = "keel_transcripts"
MAX_ATTEMPTS = 3  # as the transcript activity was retried (workflows.options.BEST_EFFORT_RETRY)
BACKOFF_S = (1.0, 2.0)  # before the second and the third attempt
SWEEP_S = 2.0
# After a notification, before the drain (see `_drain_forever`): while replies come fast
# (the last wake was less than QUIET_S ago), and after a quiet spell.
SETTLE_S, QUIET_SETTLE_S, QUIET_S = 0.1, 0.015, 0.5
BATCH = 50
RECONNECT_S = 1.0
STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class QueuedTranscript:
    """One model call's share of the daily transcript (a row of `transcript_outbox`); or,
    `forget`, a rewind's: the rewound messages (`seqs`) whose entries go, keyed by the last
    (`reply_seq`)."""

    session_id: str
    scope: str
    reply_seq: int
    seqs: list[int]
    recalled: list[str]
    forget: bool = False


async def queue_transcript(conn: AsyncConnection, vault_queue: str,
                           item: QueuedTranscript) -> bool:
    """Queue `item` for the vault worker of `vault_queue`, inside the caller's transaction
    (the notification is sent when it commits). False when there is nothing to write."""
    if not (item.seqs or item.recalled):
        return False
    # One statement: the row, then the notification (sent when the transaction commits).
    await conn.execute(
        "WITH queued AS (INSERT INTO transcript_outbox (vault_queue, session_id, scope,"
        " reply_seq, seqs, recalled, forget) VALUES (%s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT DO NOTHING) SELECT pg_notify(%s, %s)",
        (vault_queue, item.session_id, item.scope, item.reply_seq, item.seqs, item.recalled,
         item.forget, CHANNEL, vault_queue))
    return True


@dataclass(frozen=True)
class _Row:
    """A row of `transcript_outbox` as the drainer takes it."""

    id: int
    session_id: str
    scope: str
    seqs: list[int]
    recalled: list[str]
    attempts: int
    forget: bool

    def transcripts(self) -> TranscriptsInput:
        return TranscriptsInput(session_id=self.session_id, seqs=list(self.seqs),
                                scope=self.scope, recalled=list(self.recalled))


# What the drainer does with a row that failed for good: tell its session.
Report = Callable[[str, str], Awaitable[None]]


class TranscriptDrainer:
    """Drains the outbox rows of one vault queue into the vaults, in the vault's owner."""

    def __init__(self, database_url: str, vault_queue: str, memory: MemoryActivities,
                 report: Report, sweep_s: float = SWEEP_S, settle_s: float = SETTLE_S,
                 ) -> None:
        self.database_url, self.vault_queue = database_url, vault_queue
        self.memory, self.report, self.sweep_s = memory, report, sweep_s
        self.settle_s = settle_s
        self._wake = asyncio.Event()
        self.sweeps = 0  # drains done (a test waits for the first)
        self._task: asyncio.Task[None] | None = None
        meter = Runtime.default().metric_meter.with_additional_attributes(
            {"vault_queue": vault_queue})
        self._written = meter.create_counter(*TRANSCRIPTS_WRITTEN)
        self._dropped = meter.create_counter(*TRANSCRIPTS_DROPPED)
        self._waiting = meter.create_gauge(*TRANSCRIPTS_WAITING)
        self._counted_at = float("-inf")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[TranscriptDrainer]:
        """The drainer's loop for as long as the context is open (or until `stop`)."""
        self._task = asyncio.create_task(self._run())
        try:
            yield self
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Stop writing now (the vault's lock is lost: another worker may own it)."""
        task, self._task = self._task, None
        if task is not None:
            await stop_task(task, grace_s=STOP_GRACE_S,
                            what=f"the transcript drainer of {self.vault_queue}")

    async def _run(self) -> None:
        outage = Outage(f"the transcript outbox of {self.vault_queue}", log)
        while True:
            try:
                async with await AsyncConnection.connect(
                        self.database_url, autocommit=True) as conn:
                    heard = Notifications(conn)
                    await conn.execute(f"LISTEN {CHANNEL}")
                    outage.back()
                    listener = asyncio.create_task(self._listen(heard))
                    try:
                        await self._drain_forever()
                    finally:
                        listener.cancel()
                        with contextlib.suppress(asyncio.CancelledError, psycopg.Error):
                            await listener
            except (psycopg.Error, OSError) as err:
                outage.lost(err, RECONNECT_S)
                await asyncio.sleep(RECONNECT_S)

    async def _listen(self, heard: Notifications) -> None:
        async for note in heard:
            if note.payload == self.vault_queue:
                self._wake.set()

    async def _drain_forever(self) -> None:
        loop = asyncio.get_running_loop()
        woken = float("-inf")
        while True:
            while await self.drain_once() == BATCH:
                pass  # a backlog: the next batch at once
            self.sweeps += 1
            if loop.time() - self._counted_at >= self.sweep_s:
                self._counted_at = loop.time()
                await self._count_waiting()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.sweep_s)
            if self._wake.is_set():
                # Woken by a reply's commit: its turn's last workflow task runs now, often
                # in this process. Let it finish first; while replies come fast, wait
                # longer so that the next ones join this write.
                fast, woken = loop.time() - woken < QUIET_S, loop.time()
                await asyncio.sleep(self.settle_s if fast else QUIET_SETTLE_S)
            self._wake.clear()

    async def drain_once(self) -> int:
        """Write the due rows (up to BATCH); how many were taken. A scope's rows go in one
        write (`MemoryActivities.append_queued`: one vault lock, one index batch); when
        that fails, row by row, so only the row at fault waits its retry."""
        pool = await get_pool(self.database_url)
        async with pool.connection() as conn:
            # A session's rows in order: none is taken while an earlier one waits its retry.
            rows = [_Row(*row) for row in await (await conn.execute(
                "SELECT id, session_id, scope, seqs, recalled, attempts, forget"
                " FROM transcript_outbox t"
                " WHERE vault_queue = %s AND next_try_at <= now() AND NOT EXISTS ("
                "  SELECT 1 FROM transcript_outbox e WHERE e.session_id = t.session_id"
                "  AND e.id < t.id AND e.next_try_at > now())"
                " ORDER BY id LIMIT %s", (self.vault_queue, BATCH))).fetchall()]
            scopes: dict[str, list[_Row]] = {}
            for row in rows:  # a session keeps its scope: its rows stay in order
                if not row.forget:
                    scopes.setdefault(row.scope, []).append(row)
            failed: set[str] = set()  # a session whose row failed: its later rows wait
            for scope, group in scopes.items():
                if len(group) > 1 and await self._write_together(conn, scope, group):
                    continue
                for row in group:
                    if row.session_id not in failed and not await self._write(conn, row):
                        failed.add(row.session_id)
            # A rewind's after the appends taken with it: an append never writes a
            # rewound message, so what they wrote before the rewind is all there is to take.
            for row in rows:
                if row.forget and row.session_id not in failed:
                    await self._write(conn, row)
        return len(rows)

    async def _count_waiting(self) -> None:
        pool = await get_pool(self.database_url)
        async with pool.connection() as conn:
            row = await (await conn.execute(
                "SELECT count(*) FROM transcript_outbox WHERE vault_queue = %s",
                (self.vault_queue,))).fetchone()
        self._waiting.set(row[0] if row else 0)

    async def _write_together(self, conn: AsyncConnection, scope: str,
                              group: list[_Row]) -> bool:
        try:
            await self.memory.append_queued(scope, [row.transcripts() for row in group])
        except Exception as err:  # one row at fault, or all: row by row tells which
            log.info("transcript outbox of %s: %d rows of scope %s one by one: %s",
                     self.vault_queue, len(group), scope, err)
            return False
        await conn.execute("DELETE FROM transcript_outbox WHERE id = ANY(%s)",
                           ([row.id for row in group],))
        self._written.add(len(group))
        return True

    async def _apply(self, row: _Row) -> None:
        if not row.forget:
            await self.memory.append_transcripts(row.transcripts())
            return
        _, unreadable = await self.memory.forget_rewound(row.scope, row.session_id, row.seqs)
        if unreadable:  # no retry reads them better: said once
            one = len(unreadable) == 1
            await self._report(row.session_id, "the rewound messages' entries stay in "
                               f"{', '.join(unreadable)}: {'it holds' if one else 'they hold'}"
                               " bytes that are not UTF-8, so Keel does not rewrite "
                               f"{'it' if one else 'them'} (edit by hand)")

    async def _write(self, conn: AsyncConnection, row: _Row) -> bool:
        try:
            await self._apply(row)
        except Exception as err:  # the vault, the index, a message gone: retried, then said
            attempts = row.attempts + 1
            reason = f"{type(err).__name__}: {err}"[:500]
            if attempts < MAX_ATTEMPTS:
                await conn.execute(
                    "UPDATE transcript_outbox SET attempts = %s, last_error = %s,"
                    " next_try_at = now() + make_interval(secs => %s) WHERE id = %s",
                    (attempts, reason, BACKOFF_S[min(attempts, len(BACKOFF_S)) - 1], row.id))
                return False
            what = f"#{row.seqs[0]}-#{row.seqs[-1]}" if row.seqs else "recalled notes"
            done = "taken out of long memory after the rewind" if row.forget else "written"
            await self._report(row.session_id, f"the transcript of {what} could not be "
                                               f"{done}: {reason}")
            self._dropped.add(1)
        else:
            self._written.add(1)
        await conn.execute("DELETE FROM transcript_outbox WHERE id = %s", (row.id,))
        return True

    async def _report(self, session_id: str, message: str) -> None:
        log.warning("session %s: %s", session_id, message)
        try:
            await self.report(session_id, message)
        except Exception as err:  # the session ended or is gone: the log line says it
            log.warning("session %s not told of its transcript: %s", session_id, err)
