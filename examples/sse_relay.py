"""A web service relaying a session's events to a browser as server-sent events.

    TEMPORAL_ADDRESS=localhost:7233 uvicorn examples.sse_relay:app --port 8000
    curl -N http://localhost:8000/sessions/support-42/events
    # in a page: new EventSource("/sessions/support-42/events")

Each event goes out as one SSE message: `id:` its stream offset, `event:` its type, `data:`
its JSON. A browser that loses the connection reconnects with `Last-Event-ID` (the last
offset it saw), and the relay resumes right after it, so nothing is missed or doubled while
the stream retains it (an `events_missed` message says when it does not). A new page starts
at `?from=OFFSET`, or by default at what happens from now on.

One relay process can serve many browsers; each open page is one stream reader. Readers use
the session's in-flight Updates (10 a run, shared with its input), so past a couple of pages
per session this relay reads by Query instead (KEEL_RELAY_TRANSPORT=query), which costs the
session nothing but may, after a worker crash, show an event the session then redoes.
Uses `starlette` and `uvicorn`, which Keel's web UI installs too.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from keel.client import KeelClient, Transport
from keel.live import event_dict
from schemas.config import KeelSettings

TRANSPORT = Transport(os.environ.get("KEEL_RELAY_TRANSPORT", Transport.UPDATE.value))
keel: KeelClient | None = None


@asynccontextmanager
async def lifespan(_app: Starlette) -> AsyncIterator[None]:
    global keel
    keel = await KeelClient.connect(KeelSettings.from_env())
    yield


def sse(offset: int, kind: str, data: dict[str, object]) -> bytes:
    return f"id: {offset}\nevent: {kind}\ndata: {json.dumps(data)}\n\n".encode()


async def events(request: Request) -> StreamingResponse:
    assert keel is not None
    session = keel.session(request.path_params["session_id"])
    last = request.headers.get("last-event-id")
    if last is not None and last.isascii() and last.isdecimal():  # "²" is a digit to isdigit
        after = int(last) + 1  # a reconnecting browser: right after what it saw
    elif (start := request.query_params.get("from", "")).isascii() and start.isdecimal():
        after = int(start)
    else:
        after = await session.event_offset()

    async def body() -> AsyncIterator[bytes]:
        yield b": connected\n\n"
        async for offset, event in session.events(after=after, transport=TRANSPORT):
            if await request.is_disconnected():
                return
            yield sse(offset, event.type, event_dict(offset, event))

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"cache-control": "no-cache",
                                      "x-accel-buffering": "no"})


app = Starlette(routes=[Route("/sessions/{session_id}/events", events)], lifespan=lifespan)
