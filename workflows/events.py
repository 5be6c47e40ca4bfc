"""SessionEvents: the session workflow's side of its event stream (workflow_streams).

Invariant: a session has one stream, one topic (`events`), and offsets that only grow, across
continue-as-new and worker restarts. The stream's log is workflow state: publishes from
workflow code are deterministic appends (replay rebuilds them), publishes from activities
arrive as the stream's signal and are de-duplicated by publisher and sequence. Before a run
ends (continue-as-new or for good) its waiting subscribers are released, and the log's newest
part (at most `retain_events` events and `retain_bytes` bytes) is carried into the next run;
older events are gone from the stream (a subscriber asking for them starts at the oldest kept
one and is told what it missed) but everything durable is in the record.

The recipe in SessionWorkflow (workflows.session; the rooms reach it as `SessionRun.events`):

    # input: a field `events: WorkflowStreamState | None = None` on SessionInput (typed so,
    # never Any, or the converter hands back a dict)
    @workflow.init
    def __init__(self, input: SessionInput) -> None:
        events = SessionEvents(input.session_id, input.events)   # in __init__ only

    events.emit(TurnStarted, turn=state.turn, input_seqs=first)  # anywhere

    # continue-as-new: release subscribers *before* waiting for handlers
    events.detach()
    await workflow.wait_condition(workflow.all_handlers_finished)
    workflow.continue_as_new(SessionInput(..., events=events.carry()))

    # the session's end: the last event, then release subscribers, then return
    events.emit(SessionEnded, reason=...)
    events.detach()
    await workflow.wait_condition(workflow.all_handlers_finished)
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from temporalio.contrib.workflow_streams import (
        PollInput,
        PollResult,
        WorkflowStream,
        WorkflowStreamState,
    )

    from schemas.events import TOPIC, SessionEvent, StreamWatchers, event_payload
    from schemas.session import Handler

from workflows.metrics import EventMetrics

__all__ = ["SessionEvents"]
RETAIN_EVENTS = 1_000
RETAIN_BYTES = 256_000  # of stored payload bytes carried in the continue-as-new input
# Dedup state of an activity publisher idle this long is dropped at continue-as-new. It must
# exceed the longest a publisher retries one batch (activities.events.MAX_RETRY).
PUBLISHER_TTL = timedelta(minutes=5)
# The stream's poll, an Update (a reader waiting) and a Query (a reader polling) of one name,
# and the signal an activity publishes by (temporalio.contrib.workflow_streams._stream).
STREAM_POLL = "__temporal_workflow_stream_poll"
STREAM_PUBLISH = "__temporal_workflow_stream_publish"


class SessionEvents:
    """Held by the session workflow; constructed once, from its `@workflow.init`."""

    def __init__(self, session_id: str, prior: WorkflowStreamState | None = None, *,
                 retain_events: int = RETAIN_EVENTS, retain_bytes: int = RETAIN_BYTES) -> None:
        self.session_id = session_id
        self.retain_events = retain_events
        self.retain_bytes = retain_bytes
        # WorkflowStream registers its signal, update and queries on the running workflow and
        # insists on being built from a method named __init__: this one, called from the
        # workflow's own __init__.
        self.stream = WorkflowStream(prior)
        self.topic = self.stream.topic(TOPIC)
        self.watchers = StreamWatchers()
        self.metrics = EventMetrics()
        self._watch_polls()

    # ----- who reads ------------------------------------------------------------------------

    def _watch_polls(self) -> None:
        """Count the stream's polls around the stream's own handlers, and answer the model
        activity's question (activities.events): while nobody reads, it sends no deltas,
        each of which would be a signal, a workflow task and four history events. The
        counts decide no command: a replay that rebuilds them otherwise changes nothing."""
        on_poll = workflow.get_update_handler(STREAM_POLL)
        read_now = workflow.get_query_handler(STREAM_POLL)
        assert on_poll is not None and read_now is not None  # WorkflowStream set them
        watchers = self.watchers

        async def poll(payload: PollInput) -> PollResult:
            watchers.saw(payload.from_offset)
            watchers.waiting += 1
            try:
                result: PollResult = await on_poll(payload)
                return result
            finally:
                watchers.waiting -= 1

        def query(payload: PollInput) -> PollResult:
            # A query may not change what the run decides; these counts decide nothing.
            watchers.saw(payload.from_offset)
            result: PollResult = read_now(payload)
            return result

        workflow.set_update_handler(STREAM_POLL, poll, validator=self.stream._validate_poll)
        workflow.set_query_handler(STREAM_POLL, query)
        workflow.set_query_handler(Handler.STREAM_WATCHERS, self.readers)

    def readers(self) -> StreamWatchers:
        return self.watchers.model_copy(update={"offset": self.offset()})

    # ----- publishing -----------------------------------------------------------------------

    def publish(self, event: SessionEvent) -> int:
        """Append `event`; returns its offset. Deterministic: no command, no history event.
        Counted on the worker's metrics too (replay-safe: never twice)."""
        self.topic.publish(event_payload(event))
        self.metrics.count(event)
        return self.offset() - 1

    def emit(self, cls: type[Any], **fields: Any) -> int:
        """Build and publish an event of type `cls`, stamped with this session and
        `workflow.now()`; returns its offset."""
        fields.setdefault("session_id", self.session_id)
        fields.setdefault("at", workflow.now())
        return self.publish(cls(**fields))

    def offset(self) -> int:
        """The next offset: how many events the stream has ever had."""
        return self.stream._on_offset()

    # ----- a run's end ----------------------------------------------------------------------

    def detach(self) -> None:
        """Release waiting subscribers (they get what is there and follow to the next run)
        and refuse new polls on this run. Call before waiting for `all_handlers_finished`:
        a subscriber's poll is an update handler that would otherwise never finish."""
        self.stream.detach_pollers()

    def reattach(self) -> None:
        """Take polls again after `detach` when the run goes on after all (old histories)."""
        self.stream._detaching = False

    def carry(self, retain_bytes: int | None = None) -> WorkflowStreamState:
        """The stream state for the continue-as-new input: the retained newest events (at
        most `retain_bytes` of them when given), the base offset, and the activity
        publishers' dedup state. Call after handlers finished, right before
        `workflow.continue_as_new`."""
        if retain_bytes is not None:
            self.retain_bytes = min(self.retain_bytes, retain_bytes)
        self.trim()
        return self.stream.get_state(publisher_ttl=PUBLISHER_TTL)

    def trim(self) -> None:
        """Drop the oldest events beyond `retain_events` / `retain_bytes`."""
        state = self.stream.get_state(publisher_ttl=PUBLISHER_TTL)
        end = state.base_offset + len(state.log)
        keep = 0
        size = 0
        for item in reversed(state.log):
            size += len(item.data) + len(item.topic)
            if keep >= self.retain_events or size > self.retain_bytes:
                break
            keep += 1
        if end - keep > state.base_offset:
            self.stream.truncate(end - keep)
