"""A plain turn against Temporal's floor, each in a worker process of its own, time and CPU.

    .venv/bin/python bench/bench_turn.py                  # 80 turns per series
    .venv/bin/python bench/bench_turn.py --turns 20 --out turn-quick
    .venv/bin/python bench/bench_turn.py --no-memory --out turn-no-memory  # no long memory

One embedded stack (Temporal dev server, embedded PostgreSQL) in a temporary folder; the fake
Messages API answering "ok" at once, in this process. Keel's side is a real worker process
(`python -m workers.main both`, the session and vault queues, the PostgreSQL workspace store)
and a session driven by `SessionHandle.ask` (one Update; the reply streamed, the default).
The floor is `bench/floor.py`'s workflow in its own process (`bench/floor_worker.py`, the
default sandbox and data converter): an Update running one activity that sends a minimal
request through the `anthropic` SDK; a third series has the floor send Keel's own last
request, so the model's side costs both the same.

Every call is timed alone: the three series take turns (their order rotating every round),
and each call is followed by a pause longer than any after-reply work (250 ms by default),
so one call's after-work cannot land in the next. The CPU of every process (the Temporal
server, PostgreSQL with its backends, Keel's worker, the floor's worker, this process with
the client and the fake) is read from /proc before the call and after its pause; idle
windows (the pause alone) measure what the stack spends doing nothing, reported beside.

From the session's history: events and workflow tasks per turn, and the after-reply work:
from the event that completed the turn's Update to the last workflow task completed in the
turn's window, or the last of its daily-transcript entries the vault worker indexed there
(`memory_docs.indexed_at`), whichever is later. Figures go to stdout and
bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client, WorkflowHandle  # noqa: E402

from bench.bench_throughput import wait_for_pollers  # noqa: E402
from bench.common import cancel_on_sigterm, percentile, shown, table  # noqa: E402
from bench.floor_worker import MINIMAL  # noqa: E402
from bench.procs import cpu_seconds, stack_processes, tree_cpu  # noqa: E402
from bench.stack import bench_stack, machine, write_json  # noqa: E402
from keel.client import KeelClient, SessionHandle, session_config  # noqa: E402
from schemas.config import KeelSettings, ModelSettings  # noqa: E402
from tests.fake_anthropic import FakeAnthropic, text_message  # noqa: E402

SERIES = ("keel", "floor", "floor_same_request")


class Stack:
    """The processes whose CPU a call is charged with, read together."""

    def __init__(self, settings: KeelSettings, keel: int, floor: int) -> None:
        self.pids = {**stack_processes(Path(settings.data_dir)), "keel_worker": keel,
                     "floor_worker": floor}

    def read(self) -> dict[str, float]:
        """One scan of /proc for PostgreSQL's backends; the others are single processes
        (their waited-for children included)."""
        out = {name: cpu_seconds(pid) for name, pid in self.pids.items() if name != "postgres"}
        out["postgres"] = tree_cpu(self.pids["postgres"])
        out["bench_process"] = time.process_time()
        return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


def start_worker(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)


def transcript_times(database_url: str, session_id: str) -> list[float]:
    """When each of the session's daily-transcript entries was indexed (the vault's write
    of it is the last after-reply work of its turn, wherever it runs)."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        return [t.timestamp() for (t,) in conn.execute(
            "SELECT indexed_at FROM memory_docs WHERE kind = 'daily' AND session_id = %s",
            (session_id,))]


async def session_spans(client: Client, session_id: str, windows: list[tuple[float, float]],
                        written: list[float]) -> dict[str, Any]:
    """Per Keel turn, from the session's history: its reply and its last task's times,
    and the last transcript entry written in its window (`written`)."""
    history = await client.get_workflow_handle(session_id).fetch_history()
    replies: list[list[float]] = [[] for _ in windows]
    tasks: list[list[float]] = [[] for _ in windows]
    for t in written:
        slot = next((i for i, (a, b) in enumerate(windows) if a <= t <= b), None)
        if slot is not None:
            tasks[slot].append(t)
    outside = 0
    for e in history.events:
        t = e.event_time.ToDatetime().timestamp()
        slot = next((i for i, (a, b) in enumerate(windows) if a <= t <= b), None)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            if slot is None:
                outside += 1
            else:
                tasks[slot].append(t)
        elif (e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED
              and slot is not None):
            replies[slot].append(t)
    after = [max(ts) - rs[0] for rs, ts in zip(replies, tasks, strict=True) if rs and ts]
    return {"after_reply_ms": [round(a * 1000, 1) for a in after],
            "tasks_outside_windows": outside}


async def history_counts(client: Client, workflow_id: str) -> tuple[int, int]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    tasks = sum(1 for e in history.events
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
    return len(history.events), tasks


def summary(times: list[float], cpus: list[dict[str, float]]) -> dict[str, Any]:
    total = [sum(c.values()) for c in cpus]
    return {
        "median_ms": round(statistics.median(times) * 1000, 2),
        "p90_ms": round(percentile(times, 90) * 1000, 2),
        "min_ms": round(min(times) * 1000, 2),
        "cpu_ms_median": round(statistics.median(total) * 1000, 1),
        "cpu_ms_mean": round(statistics.mean(total) * 1000, 1),
        "cpu_ms_mean_by_process": {k: round(statistics.mean(c[k] for c in cpus) * 1000, 1)
                                   for k in cpus[0]},
    }


async def measure(turns: int, warmup: int, pause: float, keel_turn: Callable[[int], Awaitable[
        None]], floor_turn: Callable[[str], Awaitable[None]], same_path: Path,
        last_request: Callable[[], dict[str, Any]], stack: Stack) -> dict[str, Any]:
    calls: dict[str, Callable[[int], Awaitable[None]]] = {
        "keel": keel_turn,
        "floor": lambda i: floor_turn(MINIMAL),
        "floor_same_request": lambda i: floor_turn(str(same_path)),
    }
    for i in range(warmup):
        await keel_turn(-1 - i)
        same_path.write_text(json.dumps(last_request()))
        await floor_turn(MINIMAL)
        await floor_turn(str(same_path))
    await asyncio.sleep(1.0)
    times: dict[str, list[float]] = {s: [] for s in SERIES}
    cpus: dict[str, list[dict[str, float]]] = {s: [] for s in (*SERIES, "idle")}
    windows: list[tuple[float, float]] = []
    for i in range(turns):
        order = SERIES[i % 3:] + SERIES[:i % 3]
        for name in (*order, "idle"):
            if name == "floor_same_request":
                same_path.write_text(json.dumps(last_request()))
            before, wall0 = stack.read(), time.time()
            t0 = time.perf_counter()
            if name != "idle":
                await calls[name](i)
                times[name].append(time.perf_counter() - t0)
            await asyncio.sleep(pause)
            cpus[name].append(delta(before, stack.read()))
            if name == "keel":
                windows.append((wall0, time.time()))
    return {"times": times, "cpus": cpus, "windows": windows}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    fake = FakeAnthropic(lambda body: text_message("ok")).start()
    model = ModelSettings(name="fake-model", base_url=fake.base_url, api_key="x",
                          request_timeout_s=30)
    try:
        async with bench_stack(model) as (client, settings):
            return await run_on(client, settings, fake, args)
    finally:
        fake.stop()


async def run_on(client: Client, settings: KeelSettings, fake: FakeAnthropic,
                 args: argparse.Namespace) -> dict[str, Any]:
    queue, floor_queue = settings.task_queue, f"{settings.task_queue}-floor"
    data = Path(settings.data_dir)
    env = {**os.environ, "TEMPORAL_ADDRESS": client.service_client.config.target_host,
           "DATABASE_URL": str(settings.database_url), "KEEL_TASK_QUEUE": queue,
           "KEEL_DATA_DIR": str(data / "worker"), "ANTHROPIC_BASE_URL": fake.base_url,
           "ANTHROPIC_API_KEY": "x", "KEEL_MODEL": "fake-model", "KEEL_VAULT_PUSH": "0",
           "KEEL_LOG_LEVEL": "WARNING", "FLOOR_TASK_QUEUE": floor_queue}
    profile = (["cProfile", "-o", str(Path(args.profile).resolve() / "{}.prof")]
               if args.profile else [])
    keel_proc = start_worker([*profile, "workers.main", "both"] if not profile else
                             [profile[0], profile[1], profile[2].format("keel"), "-m",
                              "workers.main", "both"], env, data / "keel-worker.log")
    floor_proc = start_worker(["bench.floor_worker"] if not profile else
                              [profile[0], profile[1], profile[2].format("floor"), "-m",
                               "bench.floor_worker"], env, data / "floor-worker.log")
    try:
        for q in (queue, f"{queue}-vault", floor_queue):
            await wait_for_pollers(client, q, 1)
        stack = Stack(settings, keel_proc.pid, floor_proc.pid)
        keel = KeelClient(client, queue, settings)
        config = session_config(settings, memory_scope=None) if args.no_memory else \
            session_config(settings)
        session = await keel.start_session(f"bench-turn-{uuid.uuid4().hex[:6]}",
                                           config=config)
        floor: WorkflowHandle[Any, Any] = await client.start_workflow(
            "BenchFloor", id=f"bench-floor-{uuid.uuid4().hex[:6]}", task_queue=floor_queue)
        result = await series(client, session, floor, fake, data, stack, args,
                              settings.database_url)
        await floor.signal("finish")
        return result
    finally:
        for p in (keel_proc, floor_proc):
            p.terminate()
        for p in (keel_proc, floor_proc):
            p.wait(30)


async def series(client: Client, session: SessionHandle, floor: WorkflowHandle[Any, Any],
                 fake: FakeAnthropic, data: Path, stack: Stack,
                 args: argparse.Namespace, stack_url: str | None) -> dict[str, Any]:
    keel_requests: list[dict[str, Any]] = []

    async def keel_turn(i: int) -> None:
        outcome = await session.ask(f"message {i}: please answer about the retry logic")
        if outcome.error or outcome.reply_text != "ok":
            raise RuntimeError(f"turn failed: {outcome}")
        keel_requests[:] = [dict(fake.requests[-1])]  # Keel's own, for the floor to send

    async def floor_turn(request: str) -> None:
        got = await floor.execute_update("turn", request, result_type=str)
        if got != "ok":
            raise RuntimeError(f"floor failed: {got!r}")

    before = await history_counts(client, session.session_id)
    floor_before = await history_counts(client, floor.id)
    got = await measure(args.turns, args.warmup, args.pause, keel_turn, floor_turn,
                        data / "keel-request.json", lambda: keel_requests[0], stack)
    after = await history_counts(client, session.session_id)
    floor_after = await history_counts(client, floor.id)
    keel_turns = args.turns + args.warmup
    floor_turns = 2 * (args.turns + args.warmup)
    await asyncio.sleep(1.0)  # the last turn's transcript
    assert stack_url is not None
    spans = await session_spans(client, session.session_id, got["windows"],
                                transcript_times(stack_url, session.session_id))
    if os.environ.get("BENCH_DUMP_HISTORY"):
        history = await client.get_workflow_handle(session.session_id).fetch_history()
        Path(os.environ["BENCH_DUMP_HISTORY"]).write_text(history.to_json())
    out: dict[str, Any] = {s: summary(got["times"][s], got["cpus"][s]) for s in SERIES}
    idle = [sum(c.values()) for c in got["cpus"]["idle"]]
    out["idle_window"] = {"cpu_ms_mean": round(statistics.mean(idle) * 1000, 1),
                          "cpu_ms_mean_by_process": summary([1.0], got["cpus"]["idle"])[
                              "cpu_ms_mean_by_process"]}
    k, f, s = out["keel"], out["floor"], out["floor_same_request"]
    idle_ms = out["idle_window"]["cpu_ms_mean"]
    out["ratios"] = {
        "time_median": round(k["median_ms"] / f["median_ms"], 2),
        "time_p90": round(k["p90_ms"] / f["p90_ms"], 2),
        "time_median_vs_same_request": round(k["median_ms"] / s["median_ms"], 2),
        "cpu_mean": round(k["cpu_ms_mean"] / f["cpu_ms_mean"], 2),
        "cpu_mean_idle_subtracted": round((k["cpu_ms_mean"] - idle_ms)
                                          / (f["cpu_ms_mean"] - idle_ms), 2),
    }
    after_reply = spans["after_reply_ms"]
    out["after_reply"] = {
        "median_ms": statistics.median(after_reply) if after_reply else None,
        "p90_ms": percentile(after_reply, 90) if after_reply else None,
        "max_ms": max(after_reply) if after_reply else None,
        "tasks_outside_windows": spans["tasks_outside_windows"]}
    out["history"] = {
        "events_per_turn": round((after[0] - before[0]) / keel_turns, 1),
        "workflow_tasks_per_turn": round((after[1] - before[1]) / keel_turns, 1),
        "floor_events_per_turn": round((floor_after[0] - floor_before[0]) / floor_turns, 1),
        "floor_workflow_tasks_per_turn": round((floor_after[1] - floor_before[1])
                                               / floor_turns, 1)}
    out["keel_request"] = {"messages": len(keel_requests[0].get("messages", [])),
                           "bytes": len(json.dumps(keel_requests[0]))}
    return out


def report(out: dict[str, Any]) -> None:
    rows = [[s, out[s]["median_ms"], out[s]["p90_ms"], out[s]["cpu_ms_mean"],
             out[s]["cpu_ms_mean_by_process"]["temporal_server"],
             out[s]["cpu_ms_mean_by_process"]["postgres"]] for s in SERIES]
    print(table(f"A plain turn and the floor, {out['turns']} calls each, "
                f"{out['pause_s']} s apart", ["series", "median ms", "p90 ms",
                                               "CPU ms (all)", "of it Temporal", "PostgreSQL"],
                rows))
    print(f"idle window CPU {out['idle_window']['cpu_ms_mean']} ms; ratios {out['ratios']}")
    print(f"after-reply work {out['after_reply']}; history {out['history']}")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    cancel_on_sigterm()
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    out: dict[str, Any] = {"benchmark": "turn", "machine": machine(), "turns": args.turns,
                           "warmup": args.warmup, "pause_s": args.pause,
                           "long_memory": not args.no_memory}
    out.update(await run(args))
    out["load_average"] = [round(x, 2) for x in (*load0, *os.getloadavg())]
    out["total_seconds"] = round(time.perf_counter() - t0, 1)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=80, help="calls per series")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--pause", type=float, default=0.25, help="seconds after each call")
    parser.add_argument("--out", default="turn", help="results file name in bench/results")
    parser.add_argument("--profile", default="", help="a folder: both workers run under "
                        "cProfile and leave keel.prof / floor.prof there")
    parser.add_argument("--no-memory", action="store_true", help="the session without long "
                        "memory (no daily transcript, no recall): what the vault's share is")
    result = asyncio.run(main(parser.parse_args()))
    report(result)
    path = write_json(result_name := parser.parse_args().out, result)
    print(f"figures written to {shown(path)} ({result_name})")
