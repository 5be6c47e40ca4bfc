"""Reading a session's event stream from outside: `session_events(client, session_id, after)`.

Invariant: events come in offset order, each once, from `after` on, following the session
across continue-as-new; the iterator ends after the session's `session_ended` event (or when
its workflow has closed and the rest is read). If the events from `after` were already
dropped by the stream's retention, one `EventsMissed` notice comes first, then the oldest
retained event: nothing is skipped silently.

    async for offset, event in session_events(client, "support-42", after=last + 1):
        ...
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

from pydantic import BaseModel
from temporalio.client import Client
from temporalio.common import RawValue
from temporalio.contrib.workflow_streams import WorkflowStreamClient

from schemas.events import SessionEnded, SessionEvent, parse_event
from workflows.events import TOPIC

POLL_COOLDOWN = timedelta(milliseconds=100)


class EventsMissed(BaseModel):
    """Not a stored event: the reader's notice that offsets [missed_from, missed_to) are no
    longer in the stream (retention), or could not be read back."""

    type: str = "events_missed"
    session_id: str
    missed_from: int
    missed_to: int
    reason: str = "dropped by the stream's retention; the record keeps what is durable"


async def session_events(
    client: Client, session_id: str, after: int = 0, *,
    poll_cooldown: timedelta = POLL_COOLDOWN, stop_at_end: bool = True,
) -> AsyncIterator[tuple[int, SessionEvent | EventsMissed]]:
    """The session's events from offset `after` (the first wanted; pass the last offset
    seen + 1 to resume), as `(offset, event)`.

    `client` may use any data converter: events are read as raw JSON payloads. With
    `stop_at_end` False the iterator also reads past `session_ended`, until the workflow
    has closed and its retained events are drained.
    """
    stream = WorkflowStreamClient.create(client, session_id)
    expected = after
    async for item in stream.subscribe([TOPIC], from_offset=after, result_type=RawValue,
                                       poll_cooldown=poll_cooldown):
        if item.offset < expected:
            continue  # never twice (a retried poll after truncation restarts at the base)
        if item.offset > expected:
            # At the offset just before the first retained one: resuming at "last + 1"
            # lands on it.
            yield item.offset - 1, EventsMissed(session_id=session_id, missed_from=expected,
                                                missed_to=item.offset)
        expected = item.offset + 1
        try:
            event = parse_event(item.data.payload.data)
        except ValueError as err:  # pydantic.ValidationError and bad JSON alike
            yield item.offset, EventsMissed(session_id=session_id, missed_from=item.offset,
                                            missed_to=item.offset + 1,
                                            reason=f"unreadable event: {err}"[:500])
            continue
        yield item.offset, event
        if stop_at_end and isinstance(event, SessionEnded):
            return
