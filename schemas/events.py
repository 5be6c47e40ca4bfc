"""A session's event stream: the typed events, their size bounds, and how to read one back.

Invariant: every event is small and self-describing. It names its `type` (the union's
discriminator), its `session_id` and the time `at` it happened, supplied by the caller
(workflow code passes `workflow.now()`, never the wall clock). Every text field is cut to a
fixed number of characters on construction, and every list to a fixed length, so no event can
grow the stream past a known size. Events are stored in Temporal histories and in
continue-as-new inputs forever: add fields only as optional with defaults, never rename or
remove one; a reader meeting a `type` it does not know gets an `UnknownEvent`, not an error.
"""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, TypeAdapter, ValidationError
from temporalio.api.common.v1 import Payload

# The stream's one topic: the workflow publishes on it, readers subscribe to it.
TOPIC = "events"

# --- bounds ----------------------------------------------------------------------------------

SHORT_INPUT_CHARS = 200  # a tool call's input, an input's source line
SHORT_OUTPUT_CHARS = 300  # a tool result
REASON_CHARS = 500  # errors, failure reasons, stop reasons
PREVIEW_CHARS = 500  # a reply's opening words in turn_ended (the record holds all of it)
DELTA_CHARS = 4_000  # one text delta; the activity batches far smaller ones
NAME_CHARS = 100
LIST_ITEMS = 10  # sources of a recall, fallbacks of a checkpoint, seqs of a turn
ITEM_CHARS = 200
CUT_MARK = "…"


def cut(text: str, limit: int) -> str:
    """`text` if it fits in `limit` characters, else its start and a cut mark."""
    if len(text) <= limit:
        return text
    return text[: max(limit - len(CUT_MARK), 0)] + CUT_MARK


def _cutter(limit: int) -> AfterValidator:
    return AfterValidator(lambda text: cut(text, limit))


def _list_cutter(items: int, chars: int) -> AfterValidator:
    return AfterValidator(lambda values: [cut(v, chars) for v in values[:items]])


ShortInput = Annotated[str, _cutter(SHORT_INPUT_CHARS)]
ShortOutput = Annotated[str, _cutter(SHORT_OUTPUT_CHARS)]
Reason = Annotated[str, _cutter(REASON_CHARS)]
Preview = Annotated[str, _cutter(PREVIEW_CHARS)]
DeltaText = Annotated[str, _cutter(DELTA_CHARS)]
Name = Annotated[str, _cutter(NAME_CHARS)]
ShortList = Annotated[list[str], _list_cutter(LIST_ITEMS, ITEM_CHARS)]
SeqList = Annotated[list[int], AfterValidator(lambda v: v[:LIST_ITEMS])]


class EventType(StrEnum):
    INPUT_RECORDED = "input_recorded"
    TURN_STARTED = "turn_started"
    TURN_ENDED = "turn_ended"
    TEXT_DELTA = "text_delta"
    TOOL_CALLED = "tool_called"
    TOOL_RESULT = "tool_result"
    APPROVAL_NEEDED = "approval_needed"
    APPROVAL_DECIDED = "approval_decided"
    CHECKPOINT_STARTED = "checkpoint_started"
    CHECKPOINT_STORED = "checkpoint_stored"
    CHECKPOINT_FAILED = "checkpoint_failed"
    RECALL_FOUND = "recall_found"
    ERROR = "error"
    SESSION_STOPPED = "session_stopped"
    SESSION_ENDED = "session_ended"
    BUDGET_REACHED = "budget_reached"
    BUDGET_NEAR = "budget_near"
    BUDGET_ANSWERED = "budget_answered"
    TURN_INTERRUPTED = "turn_interrupted"
    CHILD_STARTED = "child_started"
    CHILD_ANSWERED = "child_answered"
    WAKEUP_FIRED = "wakeup_fired"


class CheckpointKind(StrEnum):
    FULL = "full"  # the whole conversation before the turn condensed
    EARLIER_PART = "earlier_part"  # a retry over the earlier half only
    MOVED = "moved_without_model"  # the earliest half moved out by rule, no model call


class _Event(BaseModel):
    session_id: str
    at: datetime  # supplied by the caller: `workflow.now()` in workflow code
    turn: int | None = None


class InputRecorded(_Event):
    """An input taken in at `seq`. A message asked while the session is idle is said as its
    update is accepted, and written by its turn's first model call; in the rare case that
    neither that call nor the ordinary record after it can write it, its caller gets
    RECORD_FAILED and the seq holds a fence notice (workflows.session)."""

    type: Literal[EventType.INPUT_RECORDED] = EventType.INPUT_RECORDED
    kind: Name = ""  # "user" or a HarnessKind value
    seq: int = 0
    source_line: ShortInput | None = None  # written by Keel from the handler, never the text
    files: list[Name] = Field(default_factory=list)  # the names of the files it carried


class TurnStarted(_Event):
    type: Literal[EventType.TURN_STARTED] = EventType.TURN_STARTED
    input_seqs: SeqList = Field(default_factory=list)


class TurnEnded(_Event):
    type: Literal[EventType.TURN_ENDED] = EventType.TURN_ENDED
    reply_seq: int | None = None  # the reply's row in the record: the durable text
    reply_chars: int = 0
    reply_preview: Preview = ""
    error: Reason | None = None
    model: Name | None = None  # the model that answered (schemas.model.OFFLINE_MODEL_NAME)
    # The context after the turn, for a footer: tokens used, of the window, checkpoint at.
    context_tokens: int | None = None
    context_window: int | None = None
    checkpoint_threshold: int | None = None
    # The turn's input as the API billed it: read from the prompt cache, and the rest
    # (uncached and written); the cache lifetime the session's next call gets.
    cached_tokens: int | None = None
    uncached_tokens: int | None = None
    cache_ttl: Name | None = None
    stop_reason: Name | None = None  # the last reply's (TurnOutcome.stop_reason)


class TextDelta(_Event):
    """Model text as it is generated. Not durable one by one: a subscriber that misses some,
    or sees a retried call start over (`attempt` grows, `start` is 0 again), reads the reply
    from the record by `reply_seq` once `turn_ended` says so."""

    type: Literal[EventType.TEXT_DELTA] = EventType.TEXT_DELTA
    reply_seq: int = 0
    attempt: int = 1  # the model activity's attempt
    index: int = 0  # this delta's number within the attempt, from 0
    start: int = 0  # the character offset of `text` within the reply
    text: DeltaText = ""


class DeltaTail(BaseModel):
    """The end of a reply's text that its model activity never sent as a delta (a short reply
    is all tail): returned with the reply, and published by the workflow as the attempt's
    last `TextDelta`s (activities.events.DeltaPublisher.finish). `whole`: nobody watched the
    stream while the reply was written, so no delta went out and the tail is the reply's
    text itself, which the result already carries (`ModelReply.text`), not a copy."""

    attempt: int = 1
    index: int = 0
    start: int = 0
    text: DeltaText = ""
    whole: bool = False


def tail_deltas(tail: DeltaTail, reply_text: str) -> list[tuple[int, int, str]]:
    """(index, start, text) of each `TextDelta` a tail is published as: its text, or the
    reply's from `start` on when it is `whole`, in pieces of at most DELTA_CHARS."""
    text = reply_text[tail.start:] if tail.whole else tail.text
    return [(tail.index + i, tail.start + at, text[at:at + DELTA_CHARS])
            for i, at in enumerate(range(0, len(text), DELTA_CHARS))]


class StreamWatchers(BaseModel):
    """Who reads the session's stream, as its workflow knows it (workflows.events): polls by
    Update waiting now; every poll (Update or Query) taken so far in this worker's copy of
    the run; the furthest offset a poll asked from (-1: none) and the stream's next offset.
    The model activity publishes text deltas only while someone reads (`reading`)."""

    waiting: int = 0
    polls: int = 0
    latest: int = -1
    offset: int = 0

    def saw(self, from_offset: int) -> None:
        """A poll, asking for the events from `from_offset` on."""
        self.polls += 1
        self.latest = max(self.latest, from_offset)

    def reading(self, polls_before: int | None = None) -> bool:
        """A reader waits on a poll now, or asked from within the newest READER_LAG events
        (one following the session re-polls as each event lands), or polled since a
        previous look saw `polls_before`."""
        return (self.waiting > 0
                or (self.latest >= 0 and self.offset - self.latest <= READER_LAG)
                or (polls_before is not None and self.polls > polls_before))


# How far behind the stream's newest event a reader's last poll may have asked from and the
# reader still count as following it: a turn's first events (input, start, recall) land
# before its model call asks, each answering the waiting poll.
READER_LAG = 16


class ToolCalled(_Event):
    type: Literal[EventType.TOOL_CALLED] = EventType.TOOL_CALLED
    tool_use_id: Name = ""
    name: Name = ""
    input: ShortInput = ""  # the call's input as compact JSON, cut


class ToolResult(_Event):
    type: Literal[EventType.TOOL_RESULT] = EventType.TOOL_RESULT
    tool_use_id: Name = ""
    name: Name = ""
    output: ShortOutput = ""
    is_error: bool = False


class ApprovalNeeded(_Event):
    type: Literal[EventType.APPROVAL_NEEDED] = EventType.APPROVAL_NEEDED
    approval_id: Name = ""
    tool: Name = ""
    summary: ShortInput = ""


class ApprovalDecided(_Event):
    type: Literal[EventType.APPROVAL_DECIDED] = EventType.APPROVAL_DECIDED
    approval_id: Name = ""
    approved: bool = False
    by: Name = ""
    note: ShortInput = ""


class CheckpointStarted(_Event):
    type: Literal[EventType.CHECKPOINT_STARTED] = EventType.CHECKPOINT_STARTED
    tokens_before: int = 0
    threshold: int = 0


class CheckpointStored(_Event):
    type: Literal[EventType.CHECKPOINT_STORED] = EventType.CHECKPOINT_STORED
    kind: CheckpointKind = CheckpointKind.FULL
    checkpoint_id: Name | None = None
    tokens_before: int = 0
    tokens_after: int = 0
    fallbacks: ShortList = Field(default_factory=list)


class CheckpointFailed(_Event):
    type: Literal[EventType.CHECKPOINT_FAILED] = EventType.CHECKPOINT_FAILED
    reason: Reason = ""


class RecallFound(_Event):
    type: Literal[EventType.RECALL_FOUND] = EventType.RECALL_FOUND
    hits: int = 0
    sources: ShortList = Field(default_factory=list)


class ErrorEvent(_Event):
    type: Literal[EventType.ERROR] = EventType.ERROR
    message: Reason = ""
    where: Name = ""  # "model", "tool", "record", "checkpoint", MODEL_RETRYING, ...


# An ErrorEvent's `where` for a model call's attempt that failed, another following (the
# model activity publishes it; the turn goes on).
MODEL_RETRYING = "model_retrying"


class SessionStopped(_Event):
    type: Literal[EventType.SESSION_STOPPED] = EventType.SESSION_STOPPED
    reason: Reason = ""


class SessionEnded(_Event):
    """The last event of a session's stream: a subscriber stops reading here."""

    type: Literal[EventType.SESSION_ENDED] = EventType.SESSION_ENDED
    reason: Reason | None = None


class BudgetReached(_Event):
    """The turn is paused before its next model call until a person answers (schemas.budget)."""

    type: Literal[EventType.BUDGET_REACHED] = EventType.BUDGET_REACHED
    request_id: Name = ""
    scope: Name = ""  # "session" or "turn"
    reached: ShortInput = ""
    spent_usd: float = 0.0


class BudgetNear(_Event):
    """A budget limit is near (its `warn_at` share spent): said once, before the pause."""

    type: Literal[EventType.BUDGET_NEAR] = EventType.BUDGET_NEAR
    scope: Name = ""  # "session" or "turn"
    limit: Name = ""  # usd, input_tokens, cached_tokens or output_tokens
    said: ShortInput = ""  # "$4.0100 of $5.0000"
    share: float = 0.0


class BudgetAnswered(_Event):
    type: Literal[EventType.BUDGET_ANSWERED] = EventType.BUDGET_ANSWERED
    request_id: Name = ""
    raised: bool = False  # False: refused
    by: Name = ""


class TurnInterrupted(_Event):
    """A stop was asked of the running turn (schemas.interrupt): by a message sent with
    policy `interrupt`, or by the interrupt Update (a stop button)."""

    type: Literal[EventType.TURN_INTERRUPTED] = EventType.TURN_INTERRUPTED
    by_message: bool = False
class ChildStarted(_Event):
    """A delegate call started a child session (workflows.delegation)."""

    type: Literal[EventType.CHILD_STARTED] = EventType.CHILD_STARTED
    child_session: Name = ""
    agent: Name = ""
    tool_use_id: Name = ""


class ChildAnswered(_Event):
    """A child's answer (or its failure or timeout) reached its parent."""

    type: Literal[EventType.CHILD_ANSWERED] = EventType.CHILD_ANSWERED
    child_session: Name = ""
    outcome: Name = ""  # answered, failed, timed out, ended
    preview: Preview = ""


class WakeupFired(_Event):
    """A wakeup the agent scheduled fired and its Task was recorded at `seq`."""

    type: Literal[EventType.WAKEUP_FIRED] = EventType.WAKEUP_FIRED
    wakeup_id: Name = ""
    seq: int = 0


class UnknownEvent(BaseModel):
    """An event of a type this reader does not know (written by newer code): kept raw."""

    type: str
    session_id: str = ""
    raw: dict[str, Any] = Field(default_factory=dict)


KnownEvent = Annotated[
    InputRecorded | TurnStarted | TurnEnded | TextDelta | ToolCalled | ToolResult
    | ApprovalNeeded | ApprovalDecided | CheckpointStarted | CheckpointStored
    | CheckpointFailed | RecallFound | ErrorEvent | SessionStopped | SessionEnded
    | BudgetReached | BudgetNear | BudgetAnswered | TurnInterrupted | ChildStarted | ChildAnswered
    | WakeupFired,
    Field(discriminator="type"),
]
SessionEvent = KnownEvent | UnknownEvent

_ADAPTER: TypeAdapter[Any] = TypeAdapter(KnownEvent)
_KNOWN_TYPES = frozenset(t.value for t in EventType)


def event_json(event: SessionEvent) -> bytes:
    """The event's stored form: compact JSON, the same bytes on every replay."""
    if isinstance(event, UnknownEvent):
        return json.dumps(event.raw, separators=(",", ":"), sort_keys=True).encode()
    return event.model_dump_json().encode()


# An event travels as plain JSON whatever data converter runs (workflow and activity alike).
JSON_ENCODING = b"json/plain"


def event_payload(event: SessionEvent) -> Payload:
    """The event as a plain JSON payload: the same bytes whatever data converter runs."""
    return Payload(metadata={"encoding": JSON_ENCODING}, data=event_json(event))


def parse_event(data: bytes | str | dict[str, Any]) -> SessionEvent:
    """Read an event payload (its JSON bytes, or the decoded dict) back into its type.

    An unknown `type` gives an `UnknownEvent`; a known type with malformed fields raises
    `pydantic.ValidationError`, as does a payload with no `type` at all.
    """
    raw: Any = json.loads(data) if isinstance(data, bytes | str) else data
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise ValidationError.from_exception_data(
            "SessionEvent", [{"type": "missing", "loc": ("type",), "input": raw}])
    if raw["type"] not in _KNOWN_TYPES:
        return UnknownEvent(type=raw["type"], session_id=str(raw.get("session_id", "")),
                            raw=raw)
    event: SessionEvent = _ADAPTER.validate_python(raw)
    return event
