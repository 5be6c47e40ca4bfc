"""A worker's metrics, scraped from its Prometheus endpoint as Prometheus would: a real
worker process (`python -m workers.main both`, `KEEL_METRICS=prometheus`) on the test's
Temporal and PostgreSQL, the real SDK against the fake Messages API, whose own record of
the usage it returned (`usages`) is what the token counters are held to.

Also: the same pushed over OTLP/HTTP to a receiver decoding OpenTelemetry's protobuf; a
worker restarted under a running session replays its history without counting its turns
again; settings that cannot work stop the worker at start, named.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import threading
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from bench.common import ROOT
from keel.client import KeelClient
from schemas.config import KeelSettings, MetricsExport
from schemas.metrics import KEEL_METRICS
from tests.checkpoint_model import MARKER, CheckpointModel, good_checkpoint
from tests.fake_anthropic import ErrorStep, text_message, tool_use_message
from workers.metrics import (
    MetricsSettingsError,
    install_metrics,
    otlp_metrics_url,
    push_every,
)

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def _value(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or m["name"] != name:
            continue
        have = dict(_LABEL.findall(m["labels"] or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m["value"])
    return total


def _worker_env(temporal_env: Any, database_url: str, fake: Any, queue: str,
                **metrics: str) -> dict[str, str]:
    """A worker process's environment: the test's servers, the fake API, these metrics."""
    return {**os.environ, "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
            "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": queue, "KEEL_VAULT_PUSH": "0",
            "ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "test", **metrics}


def _start(env: dict[str, str], tmp: Path, name: str) -> subprocess.Popen[bytes]:
    data = tmp / name
    data.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "workers.main", "both"],
                            env={**env, "KEEL_DATA_DIR": str(data)},
                            stdout=subprocess.DEVNULL, stderr=(tmp / f"{name}.log").open("wb"))


async def _up(port: int, worker: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(600):
        if worker.poll() is not None:
            raise AssertionError(f"the worker exited: {log.read_text()[-2000:]}")
        try:
            await asyncio.to_thread(_scrape, port)
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise AssertionError("the metrics endpoint never answered")


def _stop(worker: subprocess.Popen[bytes]) -> None:
    worker.terminate()
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def _model(body: dict[str, Any]) -> dict[str, Any] | ErrorStep:
    """A turn that writes a file (one tool call), then says it is done; other turns: noted."""
    last = body["messages"][-1]
    results = [b for b in last["content"] if isinstance(b, dict)
               and b.get("type") == "tool_result"] if isinstance(last["content"], list) else []
    if results:
        return text_message("Written.")
    if "break" in json.dumps(last):
        return ErrorStep.invalid("messages: this request is refused")  # not retried
    if "write the notes" in json.dumps(last):
        return tool_use_message([("write_file", {"path": "notes.md", "content": "one"})])
    return text_message("noted")


async def test_a_worker_exports_temporal_s_metrics_and_keel_s_as_the_api_counted(
        temporal_env, database_url, fake_anthropic, tmp_path):
    queue = f"keel-metrics-{uuid.uuid4().hex[:8]}"
    port = _free_port()
    env = _worker_env(temporal_env, database_url, fake_anthropic, queue,
                      KEEL_METRICS="prometheus", KEEL_METRICS_ADDRESS=f"127.0.0.1:{port}")
    fake_anthropic.responder = CheckpointModel(good_checkpoint, ordinary=_model)
    keel = KeelClient(temporal_env.client, queue, KeelSettings.from_env(env))
    sid = f"metrics-{uuid.uuid4().hex[:8]}"
    worker = _start(env, tmp_path, "first")
    try:
        await _up(port, worker, tmp_path / "first.log")
        session = await keel.start_session(sid)
        assert (await session.ask("Please write the notes.")).reply_text == "Written."
        assert (await session.ask("Thanks.")).reply_text == "noted"
        assert (await session.ask("Now break.")).error is not None
        await session.checkpoint_now()
        text = await asyncio.to_thread(_scrape, port)
        vault = {"vault_queue": f"{queue}-vault"}  # the vault's one writer, in this process
        for _ in range(100):
            drained = await asyncio.to_thread(_scrape, port)
            if _value(drained, "keel_transcripts_written", **vault) >= 2 and \
                    "keel_transcripts_waiting{" in drained:
                break
            await asyncio.sleep(0.1)
        assert _value(drained, "keel_transcripts_written", **vault) >= 2
        assert _value(drained, "keel_transcripts_dropped", **vault) == 0
        assert "keel_transcripts_waiting{" in drained  # the backlog, read every sweep
    finally:
        _stop(worker)
    mine = {"task_queue": queue, "workflow_type": "SessionWorkflow"}
    answered = [b for b in fake_anthropic.requests if MARKER in json.dumps(b)
                or "break" not in json.dumps(b["messages"][-1])]  # the refused one has none
    turns = [u for u, body in zip(fake_anthropic.usages, answered, strict=True)
             if MARKER not in json.dumps(body) and "<keel:rollup" not in json.dumps(body)]
    assert len(turns) == 3 and len(turns) < len(fake_anthropic.usages)
    assert _value(text, "keel_turns", outcome="answered", **mine) == 2
    assert _value(text, "keel_turns", outcome="failed", **mine) == 1
    assert _value(text, "keel_errors", where="model", **mine) == 1
    assert _value(text, "keel_model_calls", **mine) == 3
    assert _value(text, "keel_tool_calls", **mine) == 1
    assert _value(text, "keel_model_tokens", kind="input", purpose="turn", **mine) == sum(
        u.input + u.cache_creation for u in turns)
    assert _value(text, "keel_model_tokens", kind="cached", purpose="turn", **mine) == sum(
        u.cache_read for u in turns)
    assert _value(text, "keel_model_tokens", kind="output", purpose="turn", **mine) == sum(
        u.output for u in turns)
    checkpoint = [u for u in fake_anthropic.usages if u not in turns]
    assert _value(text, "keel_checkpoints", kind="full", outcome="stored", **mine) == 1
    assert _value(text, "keel_model_tokens", kind="output", purpose="checkpoint",
                  **mine) == sum(u.output for u in checkpoint)
    assert _value(text, "keel_model_cost_microdollars", purpose="turn", **mine) > 0
    assert _value(text, "keel_turn_duration_count", **mine) == 3
    assert _value(text, "keel_turn_duration_bucket", le="900000", **mine) == 3  # long turns
    assert _value(text, "keel_session_events", type="turn_ended", **mine) == 3
    assert _value(text, "keel_session_events", type="tool_called", **mine) == 1
    assert _value(text, "keel_session_events", type="checkpoint_stored", **mine) == 1
    assert _value(text, "keel_session_events", type="text_delta", **mine) == 0
    # Temporal's own, from the same endpoint.
    assert _value(text, "temporal_workflow_task_execution_latency_count", task_queue=queue) > 0
    assert _value(text, "temporal_activity_execution_latency_count", task_queue=queue) > 0
    assert sid not in text  # no session id in a label
    # The alerting rules and the dashboard shipped name only metrics a worker serves:
    # Keel's, by its one list, and Temporal's, as scraped here.
    rules = (ROOT / "infra/prometheus/keel-alerts.yml").read_text()
    board = json.loads((ROOT / "infra/grafana/keel-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in board["panels"] for t in p["targets"])
    keel_names = {m.name for m in KEEL_METRICS}
    for shipped, must in ((rules, {"keel_turns", "keel_errors", "keel_transcripts_waiting"}),
                          (exprs, keel_names)):
        named = set(re.findall(r"\b((?:keel|temporal)_[a-z_]+)", shipped))
        assert {re.sub(r"_(bucket|count|sum)$", "", n) for n in named
                if n.startswith("keel_")} <= keel_names
        assert all(f"\n{n}{{" in text for n in named if n.startswith("temporal_")), named
        assert must <= {re.sub(r"_(bucket|count|sum)$", "", n) for n in named}


async def test_a_restarted_worker_replays_a_session_without_counting_its_turns_again(
        temporal_env, database_url, fake_anthropic, tmp_path):
    queue = f"keel-metrics-{uuid.uuid4().hex[:8]}"
    port = _free_port()
    env = _worker_env(temporal_env, database_url, fake_anthropic, queue,
                      KEEL_METRICS="prometheus", KEEL_METRICS_ADDRESS=f"127.0.0.1:{port}")
    fake_anthropic.responder = _model
    keel = KeelClient(temporal_env.client, queue, KeelSettings.from_env(env))
    session = await keel.start_session(f"metrics-{uuid.uuid4().hex[:8]}")
    mine = {"task_queue": queue, "workflow_type": "SessionWorkflow"}
    for name, asks in (("first", 3), ("second", 1)):
        worker = _start(env, tmp_path, name)
        try:
            await _up(port, worker, tmp_path / f"{name}.log")
            for n in range(asks):
                assert (await session.ask(f"Turn {name} {n}.")).error is None
            text = await asyncio.to_thread(_scrape, port)
        finally:
            _stop(worker)
        # The second worker replayed the first three turns to answer the fourth.
        assert _value(text, "keel_turns", outcome="answered", **mine) == asks, name
        assert _value(text, "keel_model_calls", **mine) == asks, name
    assert len(fake_anthropic.usages) == 4


class _Collector(ThreadingHTTPServer):
    """An OTLP/HTTP metrics receiver: every counter's latest cumulative value by name and
    attributes, decoded from the protobuf the worker posts."""

    def __init__(self) -> None:
        self.sums: dict[tuple[str, frozenset[tuple[str, str]]], int] = {}
        self.paths: list[str] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.paths.append(self.path)
                request = ExportMetricsServiceRequest.FromString(body)
                for rm in request.resource_metrics:
                    for sm in rm.scope_metrics:
                        for metric in sm.metrics:
                            for point in metric.sum.data_points:
                                labels = frozenset((a.key, a.value.string_value)
                                                   for a in point.attributes)
                                collector.sums[metric.name, labels] = point.as_int
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(ExportMetricsServiceResponse().SerializeToString())

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def value(self, name: str, **labels: str) -> int:
        return sum(v for (n, have), v in self.sums.items()
                   if n == name and set(labels.items()) <= have)


async def test_a_worker_pushes_its_metrics_over_otlp(
        temporal_env, database_url, fake_anthropic, tmp_path):
    collector = _Collector()
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    queue = f"keel-metrics-{uuid.uuid4().hex[:8]}"
    env = _worker_env(temporal_env, database_url, fake_anthropic, queue,
                      KEEL_METRICS="otlp", OTEL_METRIC_EXPORT_INTERVAL="300",
                      OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.server_port}")
    fake_anthropic.responder = _model
    keel = KeelClient(temporal_env.client, queue, KeelSettings.from_env(env))
    worker = _start(env, tmp_path, "otlp")
    try:
        session = await keel.start_session(f"metrics-{uuid.uuid4().hex[:8]}")
        assert (await session.ask("Thanks.")).reply_text == "noted"
        mine = {"task_queue": queue, "workflow_type": "SessionWorkflow"}
        for _ in range(200):
            if collector.value("keel_turns", outcome="answered", **mine) == 1:
                break
            await asyncio.sleep(0.1)
        assert collector.value("keel_turns", outcome="answered", **mine) == 1
        usage = fake_anthropic.usages[0]
        assert collector.value("keel_model_tokens", kind="output", **mine) == usage.output
        assert set(collector.paths) == {"/v1/metrics"}
    finally:
        _stop(worker)
        collector.shutdown()


def test_metrics_settings_are_read_and_a_wrong_one_named():
    assert KeelSettings.from_env({}).metrics is None
    assert KeelSettings.from_env({"KEEL_METRICS": "none"}).metrics is None
    on = KeelSettings.from_env({"KEEL_METRICS": "Prometheus",
                                "KEEL_METRICS_ADDRESS": "0.0.0.0:9100"})
    assert on.metrics is MetricsExport.PROMETHEUS and on.metrics_address == "0.0.0.0:9100"
    with pytest.raises(ValueError, match="KEEL_METRICS is 'statsd', not prometheus"):
        KeelSettings.from_env({"KEEL_METRICS": "statsd"})
    assert otlp_metrics_url({}) == "http://localhost:4318/v1/metrics"
    assert push_every({}).total_seconds() == 10
    assert push_every({"OTEL_METRIC_EXPORT_INTERVAL": "500"}).total_seconds() == 0.5
    with pytest.raises(MetricsSettingsError, match="OTEL_METRIC_EXPORT_INTERVAL is '1s'"):
        push_every({"OTEL_METRIC_EXPORT_INTERVAL": "1s"})
    # A digit to str.isdigit that int() refuses: int's own ValueError, a traceback, before.
    with pytest.raises(MetricsSettingsError, match="OTEL_METRIC_EXPORT_INTERVAL is '²'"):
        push_every({"OTEL_METRIC_EXPORT_INTERVAL": "²"})
    assert otlp_metrics_url({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == \
        "http://c:4318/v1/metrics"
    assert otlp_metrics_url({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m/x",
                             "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}) == "http://m/x"
    bad = on.model_copy(update={"metrics_address": "9100"})
    with pytest.raises(MetricsSettingsError, match="KEEL_METRICS_ADDRESS is '9100', not host"):
        install_metrics(bad)
    with pytest.raises(MetricsSettingsError, match="KEEL_METRICS_ADDRESS is 'h:²', not host"):
        install_metrics(on.model_copy(update={"metrics_address": "h:²"}))


def test_a_worker_whose_metrics_port_is_taken_stops_at_start_saying_so(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "TEMPORAL_ADDRESS": "127.0.0.1:1", "DATABASE_URL": "postgresql://x",
               "KEEL_METRICS": "prometheus", "KEEL_METRICS_ADDRESS": f"127.0.0.1:{port}",
               "KEEL_DATA_DIR": str(tmp_path)}
        done = subprocess.run([sys.executable, "-m", "workers.main", "sessions"], env=env,
                              capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"KEEL_METRICS_ADDRESS 127.0.0.1:{port}" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
