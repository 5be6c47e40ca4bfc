"""Text deltas from inside the model activity onto the running session's event stream.

Invariant: publishing never fails, slows or blocks the activity. Text is batched (one
`TextDelta` per `interval` or per `max_chars` characters, whichever comes first) and sent by
a background task as the stream's publish signal; a send that fails is logged and retried
with the same sequence on the next tick (the workflow drops a batch it has already taken),
and whatever is still unsent when the activity ends is given `CLOSE_TIMEOUT` and then
dropped. Deltas are a live view, not the record: the reply is durable in PostgreSQL.

Every signal is a history event and part of a workflow task, so no send carries more than
`SIGNAL_CHARS` of text, and a backlog (a model that writes faster than the stream sends,
as the offline one does) goes out one such batch per `BACKLOG_SPACING`, in deltas up to
`DELTA_CHARS` each: a workflow task is handed a few of them at most, never a whole reply.

    async with DeltaPublisher.for_activity(session_id, turn, reply_seq) as deltas:
        async for text in stream.text_stream:
            deltas.add(text)

A reply that comes whole within the first `interval` (the usual short one) costs no signal
at all: `finish()` hands back the text not yet cut into a delta as a `DeltaTail`, which the
activity returns and the workflow publishes itself with the reply (one publish signal and its
workflow task fewer per such turn). Only what was already cut is flushed.

Nothing is sent while nobody reads the stream: the publisher asks the workflow at once and
every `WATCH_EVERY` (the `stream_watchers` query: no history, no workflow task) whether a
reader follows it (`StreamWatchers.reading`: a poll waiting, one asked near the newest
event, or one taken since the last asking); until one does, the text only gathers. A reply
nobody watched comes back as a `whole` tail, which the workflow publishes from the reply's
own text in the result (its first REPLY_INLINE_CHARS; a reader mends the rest from the
turn's end, as for any delta missed); a reader who arrives mid-reply gets the text so far
at once, then the rest as it comes. A publisher that cannot ask (an older workflow, a
timeout) sends as if watched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from types import TracebackType

from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.workflow_streams import WorkflowStreamClient
from temporalio.exceptions import ApplicationError

from schemas.events import (
    DELTA_CHARS,
    MODEL_RETRYING,
    TOPIC,
    DeltaTail,
    ErrorEvent,
    SessionEvent,
    StreamWatchers,
    TextDelta,
    event_payload,
)
from schemas.model import model_for_attempt, retry_note
from schemas.session import Handler

log = logging.getLogger(__name__)

INTERVAL = timedelta(milliseconds=100)
MAX_CHARS = 200
SIGNAL_CHARS = 8_000  # of text in one publish signal (about 11 KB as the stream encodes it)
BACKLOG_SPACING = timedelta(milliseconds=25)  # between two sends while a backlog lasts
SEND_TIMEOUT = timedelta(seconds=5)  # one signal; on timeout the batch is retried next tick
CLOSE_TIMEOUT = timedelta(seconds=5)  # what the activity's end waits for unsent deltas
LOG_EVERY = 50  # failed sends between two log lines
MAX_RETRY = timedelta(minutes=2)  # one batch is dropped after this; < workflows.events TTL
# How often an unwatched reply asks again whether someone reads (a reader polling by query
# every 100 ms is seen at the second asking), and how long one asking may take.
WATCH_EVERY = timedelta(milliseconds=500)
WATCH_TIMEOUT = timedelta(seconds=2)

Watchers = Callable[[], Awaitable[StreamWatchers]]


class DeltaPublisher:
    """Batches a reply's text and publishes it as `TextDelta` events."""

    def __init__(self, client: Client, workflow_id: str, session_id: str, turn: int | None,
                 reply_seq: int, *, attempt: int = 1, interval: timedelta = INTERVAL,
                 max_chars: int = MAX_CHARS, watchers: Watchers | None = None) -> None:
        """`watchers` asks who reads the stream; None: publish as if someone always did."""
        self.session_id = session_id
        self.turn = turn
        self.reply_seq = reply_seq
        self.attempt = attempt
        self.interval = interval.total_seconds()
        self.max_chars = min(max_chars, DELTA_CHARS)
        self.stream = WorkflowStreamClient.create(client, workflow_id,
                                                  batch_interval=interval,
                                                  max_retry_duration=MAX_RETRY)
        self.topic = self.stream.topic(TOPIC)
        self._parts: list[str] = []
        self._chars = 0
        self._backlog = ""  # text cut from `_parts`, not yet handed to the stream
        self._first_at = 0.0
        self._index = 0
        self._start = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.failures = 0  # sends that failed (each logged)
        self.published = 0  # deltas handed to the stream client
        self._watchers = watchers
        self.watched = watchers is None  # once True, for the rest of the reply
        self._polls: int | None = None  # the workflow's poll count at the last asking
        self._looked = asyncio.Event()  # the first asking has its answer
        self._stop = asyncio.Event()

    @classmethod
    def for_activity(cls, session_id: str, turn: int | None, reply_seq: int, *,
                     interval: timedelta = INTERVAL, max_chars: int = MAX_CHARS,
                     ) -> DeltaPublisher:
        """A publisher onto the stream of the workflow that scheduled this activity."""
        info = activity.info()
        if info.workflow_id is None:
            raise RuntimeError("DeltaPublisher.for_activity needs a workflow's activity")
        client = activity.client()
        handle = client.get_workflow_handle(info.workflow_id)

        async def watchers() -> StreamWatchers:
            return await handle.query(Handler.STREAM_WATCHERS, result_type=StreamWatchers,
                                      rpc_timeout=WATCH_TIMEOUT)
        return cls(client, info.workflow_id, session_id, turn, reply_seq,
                   attempt=info.attempt, interval=interval, max_chars=max_chars,
                   watchers=watchers)

    # ----- the producer's side --------------------------------------------------------------

    def add(self, text: str) -> None:
        """Buffer generated text. Never raises, never waits."""
        if not text:
            return
        if not self._parts:
            self._first_at = time.monotonic()
        self._parts.append(text)
        self._chars += len(text)
        if self._chars >= self.max_chars:
            self._cut()
            self._wake.set()

    @property
    def text_so_far(self) -> int:
        return self._start + len(self._backlog) + self._chars

    def _cut(self) -> None:
        """Move the buffered text to the backlog the sender hands out batch by batch."""
        self._backlog += "".join(self._parts)
        self._parts, self._chars = [], 0

    def _hand_out(self) -> None:
        """Publish the next batch of the backlog (at most SIGNAL_CHARS) as deltas: of
        `max_chars` while the model streams slowly, up to DELTA_CHARS when text waits."""
        batch, self._backlog = self._backlog[:SIGNAL_CHARS], self._backlog[SIGNAL_CHARS:]
        size = self.max_chars if len(batch) <= self.max_chars * 2 else DELTA_CHARS
        now = datetime.now(UTC)
        for i in range(0, len(batch), size):
            piece = batch[i:i + size]
            try:
                self.topic.publish(event_payload(TextDelta(
                    session_id=self.session_id, at=now, turn=self.turn,
                    reply_seq=self.reply_seq, attempt=self.attempt, index=self._index,
                    start=self._start, text=piece)))
                self.published += 1
            except Exception as err:  # a converter problem: never the activity's
                self.failures += 1
                log.warning("text delta not published: %r", err)
            self._index += 1
            self._start += len(piece)

    # ----- the sender -----------------------------------------------------------------------

    async def _send(self) -> None:
        try:
            await asyncio.wait_for(self.stream.flush(), SEND_TIMEOUT.total_seconds())
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self.failures += 1
            if self.failures % LOG_EVERY == 1:  # every tick would flood the log
                log.warning("text deltas for reply #%s not sent (%d failures; will retry): %r",
                            self.reply_seq, self.failures, err)

    async def _look(self) -> bool:
        """Whether someone reads the stream (`StreamWatchers.reading`, against the polls
        counted at the last asking). Without an answer, yes: the deltas go out as they
        always did."""
        if self.watched or self._watchers is None:
            self._looked.set()
            return True
        try:
            seen = await asyncio.wait_for(self._watchers(), WATCH_TIMEOUT.total_seconds())
        except Exception as err:  # an older workflow has no such query; a slow one
            log.debug("stream readers of reply #%s unknown (%r): publishing", self.reply_seq,
                      err)
            self.watched = True
        else:
            self.watched = seen.reading(self._polls)
            self._polls = seen.polls
        self._looked.set()
        return self.watched

    async def _run(self) -> None:
        # A short reply (the usual one) is whole within the first interval and goes out as
        # the tail whoever reads: it asks nothing. Past that, until someone reads, the text
        # gathers and the workflow is asked again now and then.
        await self._tick(self.interval)
        while not self._closing and not await self._look():
            try:
                await asyncio.wait_for(self._stop.wait(), WATCH_EVERY.total_seconds())
            except TimeoutError:
                pass
        # Stopped by `_closing`, not by cancellation: on Python 3.11 `asyncio.wait_for` can
        # swallow a cancel that lands as its inner wait completes, and the loop would spin on.
        while not self._closing:
            await self._tick(BACKLOG_SPACING.total_seconds() if self._backlog
                             else self.interval)
            if self._closing:
                return
            if self._parts and time.monotonic() - self._first_at >= self.interval:
                self._cut()
            self._hand_out()
            await self._send()

    async def _tick(self, timeout: float) -> None:
        waiter = asyncio.ensure_future(self._wake.wait())
        await asyncio.wait({waiter}, timeout=timeout)
        waiter.cancel()
        self._wake.clear()

    async def _drain(self) -> None:
        """At the end: the backlog out, one batch per BACKLOG_SPACING."""
        while True:
            self._hand_out()
            await self._send()
            if not self._backlog:
                return
            await asyncio.sleep(BACKLOG_SPACING.total_seconds())

    async def __aenter__(self) -> DeltaPublisher:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def finish(self) -> DeltaTail | None:
        """End publishing, handing back the text not yet cut into a delta (None when all
        was sent): the caller passes it on to the workflow, which publishes it itself. What
        was cut already is flushed as `close` does. Never raises."""
        tail = None
        if not self.watched and self._backlog and not self._looked.is_set():
            # A long reply written faster than the first asking's answer (a fake model, the
            # offline one): whether a reader waits decides how it goes out.
            try:
                await asyncio.wait_for(self._looked.wait(), WATCH_TIMEOUT.total_seconds())
            except TimeoutError:
                pass
        if not self.watched and self._backlog:
            # Nobody read while it was written: the workflow publishes the reply's text.
            self._parts, self._chars, self._backlog = [], 0, ""
            await self.close()
            return DeltaTail(attempt=self.attempt, whole=True)
        if self._parts and not self._backlog:
            text = "".join(self._parts)
            self._parts, self._chars = [], 0
            tail = DeltaTail(attempt=self.attempt, index=self._index, start=self._start,
                             text=text)
        await self.close()
        return tail

    async def close(self) -> None:
        """Send what is left, waiting at most `CLOSE_TIMEOUT`. Never raises."""
        self._closing = True
        self._wake.set()
        self._stop.set()
        if self._task is not None:
            task, self._task = self._task, None
            if not self.watched:  # an asking still in flight is not worth the wait
                task.cancel()
            await asyncio.wait({task}, timeout=CLOSE_TIMEOUT.total_seconds())
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        self._cut()
        try:
            await asyncio.wait_for(self._drain(), CLOSE_TIMEOUT.total_seconds())
        except Exception as err:
            self.failures += 1
            log.warning("last text deltas for reply #%s dropped: %r", self.reply_seq, err)


async def publish_event(event: SessionEvent) -> None:
    """One event onto the stream of the workflow that scheduled this activity, sent now
    (a model call's failed attempt, say). Never fails or holds the activity past
    `SEND_TIMEOUT`: a send that fails is logged; the stream is a live view."""
    info = activity.info()
    if info.workflow_id is None:
        return
    try:
        stream = WorkflowStreamClient.create(activity.client(), info.workflow_id,
                                             max_retry_duration=SEND_TIMEOUT)
        stream.topic(TOPIC).publish(event_payload(event))
        await asyncio.wait_for(stream.flush(), SEND_TIMEOUT.total_seconds())
    except Exception as err:
        log.warning("%s event not published: %r", event.type, err)


async def tell_retrying(session_id: str, turn: int | None, err: ApplicationError,
                        attempts: int, asked: str | None = None,
                        fallback: str | None = None) -> None:
    """A model call's failed attempt another will follow (of `attempts`), told on the
    session's stream at once: a person waiting would otherwise see nothing for the
    retries' minutes (an API away is tried for about seven). The attempt that turns to
    the fallback model (of a call that asked `asked`) says so."""
    if err.non_retryable:
        return
    attempt = activity.info().attempt
    switch = None
    if asked is not None:
        then = model_for_attempt(asked, fallback, attempt + 1)
        switch = then if then != model_for_attempt(asked, fallback, attempt) else None
    note = retry_note(attempt, err.message, attempts, switch)
    if note is not None:
        await publish_event(ErrorEvent(session_id=session_id, at=datetime.now(UTC), turn=turn,
                                       message=note, where=MODEL_RETRYING))
