"""Reading a session's event stream from outside: `session_events(client, session_id, after)`.

Invariant: events come in offset order, each once, from `after` on, following the session
across continue-as-new; the iterator ends after the session's `session_ended` event (or when
its workflow has closed and the rest is read). If the events from `after` were already
dropped by the stream's retention, one `EventsMissed` notice comes first, then the oldest
retained event: nothing is skipped silently. Two transports read the same stream (see `Transport`):
workflow_streams' long-poll Update (the default: committed events only, exactly once, but
each read spends one of the run's Updates) and its poll Query (free for the session, but
it can read a workflow task that a crashing worker never committed).

    async for offset, event in session_events(client, "support-42", after=last + 1):
        ...
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from enum import StrEnum

from pydantic import BaseModel
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.common import RawValue
from temporalio.contrib.workflow_streams import PollInput, PollResult, WorkflowStreamClient
from temporalio.service import RPCError, RPCStatusCode

from schemas.events import TOPIC, SessionEnded, SessionEvent, parse_event

log = logging.getLogger(__name__)

POLL_COOLDOWN = timedelta(milliseconds=100)
POLL_QUERY = "__temporal_workflow_stream_poll"  # workflow_streams' query (and update) name
QUERY_RETRIES = 100  # consecutive failed queries (each a cooldown apart) before giving up
REPLAY_FAILED = "[TMPRL1100]"  # the SDK's nondeterminism code, in a query its replay failed
CLOSED_CHECK_EVERY = 10  # idle query polls between looks at whether the workflow closed


class EventsMissed(BaseModel):
    """Not a stored event: the reader's notice that offsets [missed_from, missed_to) are no
    longer in the stream (retention), or could not be read back."""

    type: str = "events_missed"
    session_id: str
    missed_from: int
    missed_to: int
    reason: str = "dropped by the stream's retention; the record keeps what is durable"


class Transport(StrEnum):
    # workflow_streams' own subscription: a long-poll Update per read. It returns only what a
    # completed workflow task committed, so a reader sees each event once, as stored, even
    # across a worker crash. The cost: every read is an Update of the session's run. A
    # waiting reader holds one of the run's in-flight Updates (server default 10,
    # `history.maxInFlightUpdates`, shared with send_message and await_reply: ten readers
    # stall the session's input) and each read counts toward the run's total (default
    # 2000, `history.maxTotalUpdates`; past it the server refuses every Update, the
    # session's input too, until continue-as-new) and adds history. For a few primary
    # readers per session; past the total it goes on by QUERY rather than fail.
    UPDATE = "update"
    # The stream's poll Query, every `poll_cooldown`: no Update, no history, no cost to
    # the session. But a query reads the worker's in-memory state, which may include a
    # workflow task not yet committed: if that worker dies before committing, the task is
    # run again and the same offsets may then hold other events (seen with a worker stopped
    # right after a turn: the reader got the turn's end twice and the next input's event
    # not at all, offsets still whole). For
    # observers that can take that (dashboards, extra tabs), not for a reader that must
    # see every event exactly once.
    QUERY = "query"


async def session_events(
    client: Client, session_id: str, after: int = 0, *,
    poll_cooldown: timedelta = POLL_COOLDOWN, stop_at_end: bool = True,
    transport: Transport = Transport.UPDATE,
) -> AsyncIterator[tuple[int, SessionEvent | EventsMissed]]:
    """The session's events from offset `after` (the first wanted; pass the last offset
    seen + 1 to resume), as `(offset, event)`.

    `client` may use any data converter: events are read as raw JSON payloads. With
    `stop_at_end` False the iterator also reads past `session_ended`, until the workflow
    has closed and its retained events are drained.
    """
    items = (_by_update(client, session_id, after, poll_cooldown)
             if transport == Transport.UPDATE
             else _by_query(client, session_id, after, poll_cooldown))
    expected = after
    async for offset, data in items:
        if offset < expected:
            continue  # never twice (a retried poll after truncation restarts at the base)
        if offset > expected:
            # At the offset just before the first retained one: resuming at "last + 1"
            # lands on it.
            yield offset - 1, EventsMissed(session_id=session_id, missed_from=expected,
                                           missed_to=offset)
        expected = offset + 1
        try:
            event = parse_event(data)
        except ValueError as err:  # pydantic.ValidationError and bad JSON alike
            yield offset, EventsMissed(session_id=session_id, missed_from=offset,
                                       missed_to=offset + 1,
                                       reason=f"unreadable event: {err}"[:500])
            continue
        yield offset, event
        if stop_at_end and isinstance(event, SessionEnded):
            return


async def stream_offset(client: Client, session_id: str) -> int:
    """The session's next offset: where a reader starts to see only what happens next."""
    return await WorkflowStreamClient.create(client, session_id).get_offset()


async def _by_update(client: Client, session_id: str, after: int,
                     cooldown: timedelta) -> AsyncIterator[tuple[int, bytes]]:
    stream = WorkflowStreamClient.create(client, session_id)
    offset = after
    try:
        async for item in stream.subscribe([TOPIC], from_offset=after, result_type=RawValue,
                                           poll_cooldown=cooldown):
            offset = item.offset + 1
            yield item.offset, item.data.payload.data
        return
    except RPCError as err:
        if err.status != RPCStatusCode.RESOURCE_EXHAUSTED and "limit" not in str(err):
            raise
        log.warning("session %s refuses stream updates (%s): reading by query", session_id,
                    err)
    async for pair in _by_query(client, session_id, offset, cooldown):
        yield pair


async def _by_query(client: Client, session_id: str, after: int,
                    cooldown: timedelta) -> AsyncIterator[tuple[int, bytes]]:
    # A handle without a run id: every query goes to the newest run, so continue-as-new
    # is followed for free, and a closed run still answers (a worker replays it).
    handle = client.get_workflow_handle(session_id)
    offset = after
    failures = 0
    idle = 0
    while True:
        try:
            result: PollResult = await handle.query(
                POLL_QUERY, PollInput(topics=[TOPIC], from_offset=offset),
                result_type=PollResult)
            failures = 0
        except (RPCError, WorkflowQueryFailedError) as err:
            # A new run whose first workflow task has not run yet, a worker restarting. Or a
            # worker just started that answered from a replay of the history and failed it
            # ("[TMPRL1100] Nondeterminism error"; seen once in a few hundred restarts, in
            # the history's first update, while the run's real task on the same history
            # went on): the next query, answered by the run the real task left in the
            # worker's cache, succeeds. Any other failure of the query is the caller's.
            if isinstance(err, WorkflowQueryFailedError) and REPLAY_FAILED not in str(err):
                raise
            failures += 1
            if failures > QUERY_RETRIES:
                raise
            await asyncio.sleep(cooldown.total_seconds())
            continue
        for wire in result.items:
            yield wire.offset, Payload.FromString(base64.b64decode(wire.data)).data
        offset = result.next_offset
        if result.more_ready:
            continue
        if result.items:
            idle = 0
        else:
            idle += 1
            if idle % CLOSED_CHECK_EVERY == 0:
                status = (await handle.describe()).status
                if status not in (None, WorkflowExecutionStatus.RUNNING):
                    return  # closed, and nothing more to read
        await asyncio.sleep(cooldown.total_seconds())
