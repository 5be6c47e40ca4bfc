"""What a session's turns and checkpoints tell the logs and the traces (workflow side).

Invariants:
- One INFO line per turn (`turn ended`) and one per checkpoint (`checkpoint stored` /
  `checkpoint failed`), written with `workflow.logger` and their fields under the record's
  `keel` extra (workers.observability puts them in the line). `workflow.logger` is silent
  during replay, so a replayed turn logs nothing twice; every field comes from workflow state
  or `workflow.now()`, never the wall clock.
- One trace per turn, and one per checkpoint, whose activities are child spans. The spans
  are opened and closed through two extern functions a Keel tracing worker registers
  (`workers.observability.KeelTracingInterceptor`); without them (no tracing configured,
  the Replayer) every call here is a no-op. No span is opened while replaying; a turn a
  worker resumed mid-way gets its span at its end (`keel.resumed`), started at the turn's
  start time, and the activities it ran before the restart stay where they were exported.
- The same moments are counted on the worker's metrics (workflows.metrics).
- Nothing here changes a command or the order of commands: tracing, logging and metrics can
  be switched on and off under running sessions.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import opentelemetry.context as otel_context
    from opentelemetry.propagate import extract

    from schemas.budget import spend_of
    from schemas.events import CheckpointKind
    from schemas.messages import ModelReply
    from schemas.session import SessionState
    from workflows.metrics import SessionMetrics

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context

    from workflows.checkpoint import CheckpointOutcome

# The extern functions KeelTracingInterceptor registers (workers.observability).
SPAN_OPEN = "__keel_span_open"
SPAN_CLOSE = "__keel_span_close"


class _Span:
    """One span opened from workflow code: its key, its start, its context carrier."""

    def __init__(self, key: str, name: str, start_ns: int, attributes: dict[str, Any]) -> None:
        self.key = key
        self.name = name
        self.start_ns = start_ns
        self.attributes = attributes
        self.carrier: dict[str, str] | None = None
        self.token: Token[Context] | None = None


def _externs() -> tuple[Any, Any] | None:
    functions = workflow.extern_functions()
    if SPAN_OPEN not in functions or SPAN_CLOSE not in functions:
        return None
    return functions[SPAN_OPEN], functions[SPAN_CLOSE]


def _open(key: str, name: str, attributes: dict[str, Any]) -> _Span:
    span = _Span(key, name, workflow.time_ns(), attributes)
    externs = _externs()
    if externs is None or workflow.unsafe.is_replaying():
        return span
    span.carrier = externs[0]({"key": key, "name": name, "attributes": attributes,
                               "time_ns": span.start_ns})
    if span.carrier:
        # Activities started from here on carry this span as their parent.
        span.token = otel_context.attach(extract(span.carrier,
                                                 context=otel_context.get_current()))
    return span


def _close(span: _Span, attributes: dict[str, Any]) -> None:
    if span.token is not None:
        otel_context.detach(span.token)
        span.token = None
    externs = _externs()
    if externs is None or workflow.unsafe.is_replaying():
        return
    externs[1]({"key": span.key, "name": span.name, "start_ns": span.start_ns,
                "time_ns": workflow.time_ns(),
                "attributes": {**span.attributes, **attributes,
                               **({} if span.carrier else {"keel.resumed": True})}})


def _spent_fields(outcome: CheckpointOutcome) -> dict[str, Any]:
    """What a checkpoint's model requests cost (its rounds, repair and flush): its own log
    line says it; the turn's `usd` includes it."""
    spent = outcome.spent
    return {"input_tokens": spent.input_tokens, "cached_tokens": spent.cached_tokens,
            "output_tokens": spent.output_tokens, "usd": round(spent.usd, 6)}


def _spent_attributes(outcome: CheckpointOutcome) -> dict[str, Any]:
    """`_spent_fields` as a span's attributes, named as the turn's span names its own."""
    return {f"keel.{name}": value for name, value in _spent_fields(outcome).items()}


class TurnObserver:
    """Counts what a turn did and says it once, in a log line and a span."""

    def __init__(self, state: SessionState) -> None:
        self.state = state
        self._span: _Span | None = None
        self._started = workflow.now()
        self.input_tokens = 0
        self.cached_tokens = 0
        self.output_tokens = 0
        self.model_calls = 0
        self.tool_calls = 0
        self.checkpoints = 0
        self.model = state.config.model
        self._pending: _Span | None = None  # the checkpoint span, until its outcome
        self.metrics = SessionMetrics()

    def _ids(self) -> dict[str, Any]:
        info = workflow.info()
        return {"session_id": info.workflow_id, "run_id": info.run_id,
                "turn": self.state.turn}

    # ----- the turn -------------------------------------------------------------------------

    def turn_started(self) -> None:
        self._started = workflow.now()
        self.input_tokens = self.cached_tokens = self.output_tokens = 0
        self.model_calls = self.tool_calls = self.checkpoints = 0
        self.model = self.state.config.model
        state = self.state
        self._span = _open(f"{state.session_id}/turn/{state.turn}", "Turn", {
            "keel.session_id": state.session_id, "keel.turn": state.turn,
            "keel.model": self.model})

    def model_called(self, reply: ModelReply) -> None:
        usage = reply.usage
        self.model_calls += 1
        self.input_tokens += usage.input_tokens + usage.cache_creation_input_tokens
        self.cached_tokens += usage.cache_read_input_tokens
        self.output_tokens += usage.output_tokens
        self.tool_calls += len(reply.tool_calls)
        self.model = reply.model or self.model
        self.metrics.model_called(spend_of(usage, reply.cost_usd), len(reply.tool_calls))

    def refused_as_too_long(self, counted: int) -> None:
        """The API refused a request as too long: the ladder takes it (its next rung)."""
        fields = {**self._ids(), "counted": counted, "usage_ratio": self.state.usage_ratio}
        workflow.logger.warning("request refused as too long; making room",
                                extra={"keel": fields})
        self.metrics.refused_as_too_long()

    def turn_ended(self, *, error: str | None) -> None:
        elapsed = workflow.now() - self._started
        self.metrics.turn_ended(failed=error is not None, duration=elapsed)
        duration = elapsed.total_seconds()
        fields = {**self._ids(), "model": self.model, "input_tokens": self.input_tokens,
                  "cached_tokens": self.cached_tokens, "output_tokens": self.output_tokens,
                  "cache_ttl": self.state.cache_ttl_now().value,
                  "model_calls": self.model_calls, "tool_calls": self.tool_calls,
                  "checkpoint": self.checkpoints > 0, "duration_s": round(duration, 3),
                  "usd": round(self.state.budget.turn_spent.usd, 6),
                  "session_usd": round(self.state.budget.spent.usd, 6),
                  **({"error": error} if error else {})}
        workflow.logger.info("turn ended", extra={"keel": fields})
        if self._span is not None:
            _close(self._span, {
                "keel.model": self.model, "keel.input_tokens": self.input_tokens,
                "keel.cached_tokens": self.cached_tokens, "keel.cache_ttl": fields["cache_ttl"],
                "keel.output_tokens": self.output_tokens,
                "keel.tool_calls": self.tool_calls, "keel.checkpoints": self.checkpoints,
                **({"keel.error": error} if error else {})})
            self._span = None

    # ----- checkpoints ----------------------------------------------------------------------

    @contextmanager
    def checkpoint_trace(self) -> Iterator[None]:
        """A trace of its own for the checkpoint chain: its steps are its children."""
        state = self.state
        outer = self._span
        if outer is not None and outer.token is not None:
            otel_context.detach(outer.token)
            outer.token = None
        n = state.checkpoint_attempts + 1
        span = _open(f"{state.session_id}/checkpoint/{n}", "Checkpoint", {
            "keel.session_id": state.session_id, "keel.turn": state.turn,
            "keel.model": state.config.model})
        try:
            yield
        finally:
            # Closed by checkpoint_stored / checkpoint_failed, which know how it went.
            if span.token is not None:
                otel_context.detach(span.token)
                span.token = None
            self._pending = span
            if outer is not None and outer.carrier:
                outer.token = otel_context.attach(extract(outer.carrier,
                                                          context=otel_context.get_current()))

    def checkpoint_stored(self, outcome: CheckpointOutcome, before: int) -> None:
        stored, kind = outcome.stored, outcome.kind
        assert stored is not None  # said only of a checkpoint that stored
        self.checkpoints += 1
        rounds, repair = (outcome.rounds, outcome.repair) if kind is not \
            CheckpointKind.MOVED else (0, False)
        fields = {**self._ids(), "kind": kind.value, "checkpoint_id": stored.checkpoint_id,
                  "tokens_before": before, "tokens_after": stored.window_tokens_after,
                  "fallbacks": list(stored.fallbacks), "rounds": rounds, "repair": repair,
                  **_spent_fields(outcome)}
        workflow.logger.info("checkpoint stored", extra={"keel": fields})
        self.metrics.checkpoint(kind.value, stored=True, spent=outcome.spent)
        attrs = {
            "keel.checkpoint_id": stored.checkpoint_id or "", "keel.checkpoint_kind": kind.value,
            "keel.tokens_before": before, "keel.tokens_after": stored.window_tokens_after,
            "keel.fallbacks": list(stored.fallbacks), "keel.rounds": rounds,
            "keel.repair": repair, **_spent_attributes(outcome)}
        if kind is CheckpointKind.MOVED:  # no chain trace: one span says it
            span = _open(f"{self.state.session_id}/move/{self.state.checkpoint_count}",
                         "Checkpoint", {"keel.session_id": self.state.session_id,
                                        "keel.turn": self.state.turn})
            _close(span, attrs)  # detaching it restores the turn's
        elif self._pending is not None:
            _close(self._pending, attrs)
            self._pending = None

    def checkpoint_failed(self, outcome: CheckpointOutcome, before: int) -> None:
        fields = {**self._ids(), "reason": outcome.reason, "tokens_before": before,
                  "rounds": outcome.rounds, "repair": outcome.repair, **_spent_fields(outcome)}
        workflow.logger.warning("checkpoint failed", extra={"keel": fields})
        self.metrics.checkpoint(outcome.kind.value, stored=False, spent=outcome.spent)
        if self._pending is not None:
            _close(self._pending, {"keel.checkpoint_failed": outcome.reason,
                                   "keel.tokens_before": before,
                                   **_spent_attributes(outcome)})
            self._pending = None
