"""A worker process's metrics: Temporal's own (task slots, poll and schedule-to-start
latencies, the sticky cache, failed tasks, requests to the server) and Keel's (turns, model
tokens and dollars, checkpoints: workflows.metrics), through one Temporal runtime.

Invariants:
- Off unless `KEEL_METRICS` says `prometheus` (an endpoint at `KEEL_METRICS_ADDRESS`/metrics,
  127.0.0.1:9464 by default) or `otlp` (pushed over OTLP/HTTP to
  `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` + /v1/metrics,
  the collector of infra/otel-collector.yaml by default, every `OTEL_METRIC_EXPORT_INTERVAL`
  ms, 10 s by default).
- Set before the process's first Temporal client: the runtime a client is made on carries
  its metrics, and the SDK's default runtime is created at that first use. A process that
  already has one (a test's) is told so, never silently left without metrics.
- A setting that cannot work (an address that is no host:port, a port already taken) stops
  the worker at start with the setting named, not a traceback.
"""

from __future__ import annotations

import os
from datetime import timedelta

from temporalio.runtime import (
    OpenTelemetryConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
)

from schemas.config import KeelSettings, MetricsExport
from schemas.metrics import TURN_DURATION

__all__ = ["MetricsSettingsError", "install_metrics", "metrics_where", "otlp_metrics_url",
           "push_every"]

OTLP_DEFAULT = "http://localhost:4318"
PUSH_EVERY_MS = 10_000  # an OTLP push's period unless OTEL_METRIC_EXPORT_INTERVAL says
# A turn lasts from a quarter second to many minutes (tool calls, approvals): the core's
# default buckets end at 10 s.
BUCKETS = {TURN_DURATION.name: [250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000,
                                  120_000, 300_000, 900_000, 3_600_000]}


class MetricsSettingsError(ValueError):
    """A metrics setting the worker cannot start with."""


def push_every(env: dict[str, str] | None = None) -> timedelta:
    """An OTLP push's period: OpenTelemetry's OTEL_METRIC_EXPORT_INTERVAL (ms), else 10 s."""
    value = (os.environ if env is None else env).get("OTEL_METRIC_EXPORT_INTERVAL")
    if not value:
        return timedelta(milliseconds=PUSH_EVERY_MS)
    if not value.isdecimal() or int(value) <= 0:
        raise MetricsSettingsError(f"OTEL_METRIC_EXPORT_INTERVAL is {value[:40]!r}, not a "
                                   "number of milliseconds")
    return timedelta(milliseconds=int(value))


def otlp_metrics_url(env: dict[str, str] | None = None) -> str:
    """Where OTLP metrics go, by OpenTelemetry's standard variables."""
    e = os.environ if env is None else env
    url = e.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    if url:
        return url
    return (e.get("OTEL_EXPORTER_OTLP_ENDPOINT") or OTLP_DEFAULT).rstrip("/") + "/v1/metrics"


def metrics_where(settings: KeelSettings) -> str:
    """Where this worker's metrics are read or sent, for its banner."""
    if settings.metrics is MetricsExport.PROMETHEUS:
        return f"http://{settings.metrics_address}/metrics (Prometheus)"
    return f"{otlp_metrics_url()} (OTLP, every {push_every().total_seconds():g} s)"


def _bind_address(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdecimal() or not 0 <= int(port) <= 65535:
        raise MetricsSettingsError(f"KEEL_METRICS_ADDRESS is {address[:80]!r}, not host:port "
                                   f"(for instance 0.0.0.0:9464)")
    return address


def _telemetry(settings: KeelSettings) -> TelemetryConfig:
    if settings.metrics is MetricsExport.PROMETHEUS:
        return TelemetryConfig(metrics=PrometheusConfig(
            bind_address=_bind_address(settings.metrics_address),
            histogram_bucket_overrides=BUCKETS))
    return TelemetryConfig(metrics=OpenTelemetryConfig(
        url=otlp_metrics_url(), http=True, metric_periodicity=push_every(),
        histogram_bucket_overrides=BUCKETS))


def install_metrics(settings: KeelSettings) -> Runtime | None:
    """The process's default Temporal runtime, exporting metrics as the settings say; None
    when they say nothing (the SDK's own default runtime is used)."""
    if settings.metrics is None:
        return None
    telemetry = _telemetry(settings)
    try:
        runtime = Runtime(telemetry=telemetry)
    except Exception as err:  # the core's bind or exporter error, as one line
        where = (f"KEEL_METRICS_ADDRESS {settings.metrics_address}"
                 if settings.metrics is MetricsExport.PROMETHEUS else
                 f"the OTLP endpoint {otlp_metrics_url()}")
        raise MetricsSettingsError(f"metrics cannot be exported at {where}: {err}") from None
    try:
        Runtime.set_default(runtime)
    except RuntimeError:
        raise MetricsSettingsError("metrics must be set up before this process's first "
                                   "Temporal client") from None
    return runtime
