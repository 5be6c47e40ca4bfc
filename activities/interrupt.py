"""Interrupting a model call from another worker: a row and a PostgreSQL notification.

Invariants:
- `send_interrupt` writes the call's (session, reply seq) to `model_interrupts` (once) and
  notifies channel `keel_interrupt`; whichever worker runs the call hears it at once.
- A call watches its own key from before it asks the model (`InterruptWatcher.watch`): the
  table is read once after the worker's listener is listening (beside the request, which
  is stopped when the row is there), and again for every watched key after the listener
  reconnects, so an interrupt sent before the call started, or while the listener was
  down, is never missed. One listening connection per worker process (per
  event loop), never one per call.
- `stop_on_interrupt` runs the model's answer as a task (built inside it) and cancels it
  the moment the interrupt comes (the HTTP stream is closed: the API stops generating); it
  returns None then, and the caller keeps what streamed so far.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import TypeVar

from psycopg import AsyncConnection

from activities.db import Outage, on_close
from activities.listen import Notifications
from activities.tasks import stop_task

__all__ = ["CHANNEL", "InterruptWatcher", "send_interrupt", "stop_on_interrupt", "watcher"]

CHANNEL = "keel_interrupt"
READY_WAIT_S = 5.0  # a call waits at most this for the listener before reading the table
RECONNECT_S = 1.0
STOP_GRACE_S = 5.0  # a grace of the listener's stop (activities.tasks)
log = logging.getLogger(__name__)
T = TypeVar("T")
Key = tuple[str, int]


async def send_interrupt(conn: AsyncConnection, session_id: str, reply_seq: int) -> None:
    # One statement, one round trip: the row kept, then the notification (sent at commit).
    await conn.execute(
        "WITH kept AS (INSERT INTO model_interrupts (session_id, reply_seq) VALUES (%s, %s)"
        " ON CONFLICT DO NOTHING) SELECT pg_notify(%s, %s)",
        (session_id, reply_seq, CHANNEL, f"{session_id}:{reply_seq}"))


class InterruptWatcher:
    """One listening connection; the calls of this process that wait on an interrupt."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.waiting: dict[Key, asyncio.Event] = {}
        self.ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._outage = Outage("the interrupt listener", log)

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def close(self) -> None:
        if self._task is not None:
            await stop_task(self._task, grace_s=STOP_GRACE_S, what="the interrupt listener")

    async def _listen(self) -> None:
        while True:
            try:
                async with await AsyncConnection.connect(self.database_url,
                                                         autocommit=True) as conn:
                    heard = Notifications(conn)
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self._outage.back()
                    self.ready.set()
                    await self._recheck(conn, list(self.waiting))
                    async for note in heard:
                        session_id, _, seq = note.payload.rpartition(":")
                        event = self.waiting.get((session_id, int(seq or 0)))
                        if event is not None:
                            event.set()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the database went away: listen again, re-read
                self.ready.clear()
                self._outage.lost(err, RECONNECT_S)
                await asyncio.sleep(RECONNECT_S)

    async def _recheck(self, conn: AsyncConnection, keys: list[Key]) -> None:
        for key in keys:
            row = await (await conn.execute(
                "SELECT 1 FROM model_interrupts WHERE session_id=%s AND reply_seq=%s",
                key)).fetchone()
            if row is not None and key in self.waiting:
                self.waiting[key].set()

    @asynccontextmanager
    async def watch(self, conn: AsyncConnection, session_id: str,
                    reply_seq: int) -> AsyncIterator[asyncio.Event]:
        """An event set when the call (session, reply seq) is interrupted."""
        key = (session_id, reply_seq)
        event = self.waiting[key] = asyncio.Event()
        self._start()
        recheck: asyncio.Task[None] | None = None
        try:
            with suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), READY_WAIT_S)
            # The table is read beside the call (the request goes out meanwhile): a row
            # found sets the event as a notification would, and the call is stopped then.
            recheck = asyncio.create_task(self._recheck(conn, [key]))
            yield event
        finally:
            try:
                if recheck is not None:  # `conn` is the caller's again once it is done
                    with suppress(Exception):
                        await asyncio.shield(recheck)
            finally:
                if self.waiting.get(key) is event:
                    del self.waiting[key]


_watchers: dict[tuple[str, int], InterruptWatcher] = {}


def watcher(database_url: str) -> InterruptWatcher:
    """This process's watcher for `database_url` on the running event loop."""
    key = (database_url, id(asyncio.get_running_loop()))
    found = _watchers.get(key)
    if found is None:
        found = _watchers[key] = InterruptWatcher(database_url)
    return found


async def _close_watchers() -> None:
    for found in list(_watchers.values()):
        await found.close()
    _watchers.clear()


on_close(_close_watchers)


async def stop_on_interrupt(make: Callable[[], Awaitable[T]], stop: asyncio.Event) -> T | None:
    """The result of the awaitable `make()` builds, or None when `stop` is set first (it is
    cancelled and its cleanup awaited, so the stream is closed when this returns). Built
    in its own task, so a stop that comes before the task starts leaves nothing unawaited."""
    async def run() -> T:
        return await make()
    if stop.is_set():
        return None
    task = asyncio.ensure_future(run())
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not task.done():
            task.cancel()
        await asyncio.wait({task})
    if task.cancelled():
        return None
    return task.result()
