"""What a session's turns and checkpoints, and the vault's rollups, count on their worker's
metrics (exported when the worker is set to: workers.metrics; otherwise every call here
records nothing).

Invariants:
- Counted through `workflow.metric_meter()`, which records nothing while a workflow
  replays: a turn a worker replays after a restart, or after its cache let it go, is never
  counted twice. Every figure comes from workflow state (the API's usage as the model call
  returned it, `workflow.now()`), never the wall clock.
- Labels are bounded: Temporal's own (namespace, task queue, workflow type) and the fixed
  values named here; never a session id, a model name a caller chose, or an error's text.
- Tokens and dollars are the budget's (`schemas.budget.Spend`: input is uncached input and
  cache writes; cached is cache reads), so a dashboard and `keel budget` agree.
- Nothing here issues a command: metrics can be switched on and off under running sessions.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import MetricCounter, MetricHistogramTimedelta

with workflow.unsafe.imports_passed_through():
    from schemas.budget import Spend
    from schemas.events import EventType, SessionEvent
    from schemas.metrics import (
        CHECKPOINTS,
        COST,
        ERRORS,
        MODEL_CALLS,
        SESSION_EVENTS,
        TOKENS,
        TOO_LONG,
        TOOL_CALLS,
        TURN_DURATION,
        TURNS,
    )

__all__ = ["EventMetrics", "SessionMetrics", "count_spend"]

MICRO = 1_000_000  # dollars are counted in millionths: a counter holds whole numbers


class EventMetrics:
    """A session's events on the metrics by type (a reply's text deltas aside: they are its
    stream, not its moments), and its errors by where they happened; the instruments made
    once, at the first event (inside the workflow), not at every publish."""

    def __init__(self) -> None:
        self._counters: tuple[MetricCounter, MetricCounter] | None = None

    def count(self, event: SessionEvent) -> None:
        kind = getattr(event, "type", None)
        if kind is None or kind == EventType.TEXT_DELTA:
            return
        if self._counters is None:
            meter = workflow.metric_meter()
            self._counters = (meter.create_counter(*SESSION_EVENTS),
                              meter.create_counter(*ERRORS))
        events, errors = self._counters
        events.add(1, {"type": str(kind)})
        if kind == EventType.ERROR:
            errors.add(1, {"where": str(getattr(event, "where", "")) or "other"})


def count_spend(spent: Spend, purpose: str, tokens: MetricCounter | None = None,
                cost: MetricCounter | None = None) -> None:
    """Model spend on the metrics, by purpose (the instruments made here unless given)."""
    meter = workflow.metric_meter()
    tokens = tokens or meter.create_counter(*TOKENS)
    for kind, n in (("input", spent.input_tokens), ("cached", spent.cached_tokens),
                    ("output", spent.output_tokens)):
        if n:
            tokens.add(n, {"kind": kind, "purpose": purpose})
    if spent.usd > 0:
        (cost or meter.create_counter(*COST)).add(round(spent.usd * MICRO),
                                                  {"purpose": purpose})


class SessionMetrics:
    """One session run's instruments, made on first use (inside the workflow)."""

    def __init__(self) -> None:
        self._made = False

    def _make(self) -> None:
        if self._made:
            return
        meter = workflow.metric_meter()
        self.turns: MetricCounter = meter.create_counter(*TURNS)
        self.turn_duration: MetricHistogramTimedelta = meter.create_histogram_timedelta(
            *TURN_DURATION, "duration")
        self.model_calls = meter.create_counter(*MODEL_CALLS)
        self.tokens = meter.create_counter(*TOKENS)
        self.cost = meter.create_counter(*COST)
        self.tool_calls = meter.create_counter(*TOOL_CALLS)
        self.checkpoints = meter.create_counter(*CHECKPOINTS)
        self.too_long = meter.create_counter(*TOO_LONG)
        self._made = True

    def model_called(self, spent: Spend, tool_calls: int) -> None:
        self._make()
        self.model_calls.add(1)
        self._spent(spent, "turn")
        if tool_calls:
            self.tool_calls.add(tool_calls)

    def turn_ended(self, *, failed: bool, duration: timedelta) -> None:
        self._make()
        self.turns.add(1, {"outcome": "failed" if failed else "answered"})
        self.turn_duration.record(max(duration, timedelta(0)))

    def checkpoint(self, kind: str, *, stored: bool, spent: Spend) -> None:
        self._make()
        self.checkpoints.add(1, {"kind": kind, "outcome": "stored" if stored else "failed"})
        self._spent(spent, "checkpoint")

    def refused_as_too_long(self) -> None:
        self._make()
        self.too_long.add(1)

    def _spent(self, spent: Spend, purpose: str) -> None:
        count_spend(spent, purpose, self.tokens, self.cost)
