"""The live relay: a session page kept up to date by server-sent events.

Three feeds put into one bounded queue, and one loop writes the queue out as events:

    record  the record's new rows, rendered by `_messages.html` (polled from `keel.record`)
    status  the session's status query, every `LIVE_STATUS_EVERY_S`
    event   the session's event stream (`keel.events`), read by query: an observer that
            costs the session nothing

Invariants: the feeds only read; they live exactly as long as the response (cancelled when
the page goes away); a session without the event stream still gets its record and status
(one `stream` event says the stream is not there); text deltas older than `CATCH_UP_S`
when the page connects are not relayed (the record has those replies whole). An event's
text goes out as the pages show text (`schemas.text.visible`: its control codes and bidi
overrides by their pictures), a delta's offset moved to match (`ShownDeltas`), so the
page's reply so far is the reply as shown.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from keel.events import Transport, session_events
from keel.record import read_record_async
from keel.ui.context import UiContext, ui
from keel.ui.pages import no_such_session, session_known, session_status
from keel.ui.views import conversation
from schemas.events import TextDelta
from schemas.text import visible_in

__all__ = ["live"]

LIVE_RECORD_POLL_S = 0.5
LIVE_STATUS_EVERY_S = 2.0
LIVE_PING_S = 15.0
CATCH_UP_S = 5.0  # text deltas older than this when the page connects are not relayed

Outbox = asyncio.Queue[tuple[str, dict[str, Any]]]
Feed = Callable[[], Coroutine[Any, Any, None]]


async def live(request: Request) -> Response:
    """A session's page kept live (server-sent events); 404, as its page, for a session
    neither in the record nor running, not a stream that never says anything."""
    session_id = request.path_params["session_id"]
    q = request.query_params
    after_seq, after_event = _count(q.get("after_seq")), _count(q.get("after_event"))
    if after_seq is None or after_event is None:
        return PlainTextResponse("after_seq and after_event are whole numbers, 0 or more",
                                 status_code=400)
    ctx = ui(request)
    if not await session_known(ctx, session_id) and await session_status(
            ctx.keel.session(session_id)) is None:  # as its page: in the record, or running
        return no_such_session(request, session_id)
    follow_record = q.get("record", "1") == "1"
    return StreamingResponse(
        _live_stream(request, session_id, after_seq, after_event, follow_record),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def _count(value: str | None) -> int | None:
    """A query's whole number, 0 when absent; None when it is none (a page's own script
    sends only what the stream gave it)."""
    try:
        found = int(value or 0)
    except ValueError:
        return None
    return found if found >= 0 else None


async def _record_rows(ctx: UiContext, session_id: str, after_seq: int, out: Outbox
                       ) -> None:
    last = after_seq
    while True:
        async with ctx.connection() as conn:
            rows = await read_record_async(conn, session_id, from_seq=last + 1, limit=100)
        if rows:
            last = rows[-1].seq
            html = ctx.env.get_template("_messages.html").render(
                messages=conversation(rows), session_id=session_id, csrf=ctx.csrf)
            await out.put(("record", {"html": html, "last_seq": last, "rows": len(rows)}))
            continue
        await asyncio.sleep(LIVE_RECORD_POLL_S)


async def _status_updates(ctx: UiContext, session_id: str, out: Outbox) -> None:
    handle = ctx.keel.session(session_id)
    while True:
        status = await session_status(handle)
        if status is not None:
            await out.put(("status", status.model_dump(mode="json")))
        await asyncio.sleep(LIVE_STATUS_EVERY_S)


class ShownDeltas:
    """An event as the page gets it: its strings shown (`visible`); a text delta's `start`
    where its text begins in the reply as shown so far, for the deltas of one reply's
    attempt that come in order (the relay's), its own otherwise."""

    def __init__(self) -> None:
        # (reply seq, attempt) -> where the last delta ended: in the reply, as shown
        self._ends: dict[tuple[int, int], tuple[int, int]] = {}

    def shown(self, offset: int, event: BaseModel) -> dict[str, Any]:
        data = visible_in(event.model_dump(mode="json"))
        if isinstance(event, TextDelta):
            key = (event.reply_seq, event.attempt)
            if key not in self._ends:  # one reply's attempt streams at a time: forget the last
                self._ends.clear()
            end, shown_end = self._ends.get(key, (0, 0))
            start = shown_end if event.start == end else event.start
            self._ends[key] = (event.start + len(event.text), start + len(data["text"]))
            data["start"] = start
        return {"offset": offset, **data}


async def _events(ctx: UiContext, session_id: str, after_event: int, out: Outbox) -> None:
    connected = datetime.now(UTC)
    deltas = ShownDeltas()
    try:
        async for offset, event in session_events(
                ctx.keel.client, session_id, after_event, stop_at_end=False,
                transport=Transport.QUERY):
            if (isinstance(event, TextDelta)
                    and (connected - event.at).total_seconds() > CATCH_UP_S):
                continue
            await out.put(("event", deltas.shown(offset, event)))
    except Exception as err:  # a session without the stream: the record still flows
        await out.put(("stream", {"available": False, "reason": str(err)[:300]}))


async def _live_stream(request: Request, session_id: str, after_seq: int,
                       after_event: int, follow_record: bool) -> AsyncIterator[str]:
    ctx = ui(request)
    out: Outbox = asyncio.Queue(maxsize=1_000)
    feeds: list[Feed] = [lambda: _status_updates(ctx, session_id, out),
                         lambda: _events(ctx, session_id, after_event, out)]
    if follow_record:
        feeds.insert(0, lambda: _record_rows(ctx, session_id, after_seq, out))
    tasks = [asyncio.create_task(feed()) for feed in feeds]
    try:
        async for chunk in _relay(request, out):
            yield chunk
    finally:
        for t in tasks:
            t.cancel()


async def _relay(request: Request, out: Outbox) -> AsyncIterator[str]:
    """The queue as server-sent events, a ping comment when it is quiet, until the page
    goes away."""
    yield ": connected\n\n"
    last_ping = time.monotonic()
    while True:
        try:
            name, data = await asyncio.wait_for(out.get(), 1.0)
        except TimeoutError:
            if await request.is_disconnected():
                return
            if time.monotonic() - last_ping > LIVE_PING_S:
                last_ping = time.monotonic()
                yield ": ping\n\n"
            continue
        yield f"event: {name}\ndata: {json.dumps(data)}\n\n"
