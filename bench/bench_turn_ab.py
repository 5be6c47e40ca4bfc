"""Two checkouts of Keel, one plain turn each in turn, on one stack: a change's effect on a
machine other work shares.

    .venv/bin/python bench/bench_turn_ab.py A_DIR B_DIR            # 80 pairs
    .venv/bin/python bench/bench_turn_ab.py ../main . --turns 40   # main against this tree

A timing on a shared 2-core machine moves by a fifth from run to run; two runs of
`bench_turn.py` at two commits compare loads, not code. Here both checkouts run at once:
one embedded stack (Temporal dev server, embedded PostgreSQL) in a temporary folder, a
database each on it (B's is made empty, each worker applies its own migrations), a Keel
worker process for each (`python -m workers.main both` started in that checkout, with it
alone on PYTHONPATH, on a task queue of its own), and a session on each. The calls
alternate A, B / B, A, each followed by the pause, so both see the same load. The fake
Messages API (this checkout's) answers "ok" at once for both. Per series: the median and
p90 of `ask`, and CPU per turn of its worker and of the shared Temporal server and
PostgreSQL in its call's window; B / A of each. Figures go to stdout and
bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from psycopg.conninfo import make_conninfo  # noqa: E402
from temporalio.client import Client  # noqa: E402

from bench.bench_throughput import wait_for_pollers  # noqa: E402
from bench.common import cancel_on_sigterm, percentile, shown, source_commit  # noqa: E402
from bench.procs import child_matching, cpu_seconds, postmaster_pid, tree_cpu  # noqa: E402
from bench.stack import bench_stack, machine, write_json  # noqa: E402
from keel.client import KeelClient, SessionHandle, session_config  # noqa: E402
from schemas.config import KeelSettings, ModelSettings  # noqa: E402
from tests.fake_anthropic import FakeAnthropic, text_message  # noqa: E402

SERIES = ("A", "B")


def start_worker(name: str, root: Path, url: str, queue: str, client: Client,
                 fake: FakeAnthropic, data: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(root), "DATABASE_URL": url,
           "TEMPORAL_ADDRESS": client.service_client.config.target_host,
           "KEEL_TASK_QUEUE": queue, "KEEL_DATA_DIR": str(data / f"worker-{name}"),
           "ANTHROPIC_BASE_URL": fake.base_url, "ANTHROPIC_API_KEY": "x",
           "KEEL_MODEL": "fake-model", "KEEL_VAULT_PUSH": "0", "KEEL_LOG_LEVEL": "WARNING"}
    with (data / f"worker-{name}.log").open("ab") as log:
        return subprocess.Popen([sys.executable, "-m", "workers.main", "both"], cwd=root,
                                env=env, stdout=log, stderr=subprocess.STDOUT)


async def pairs(sessions: dict[str, SessionHandle], cpu: dict[str, Any], turns: int,
                warmup: int, pause: float) -> dict[str, dict[str, list[float]]]:
    got: dict[str, dict[str, list[float]]] = {
        n: {"time": [], "cpu": [], "worker_cpu": []} for n in SERIES}
    for i in range(warmup + turns):
        for name in (SERIES if i % 2 == 0 else SERIES[::-1]):
            before, worker0 = cpu["all"](name), cpu["worker"](name)
            t0 = time.perf_counter()
            outcome = await sessions[name].ask(f"message {i}: please answer about the retry")
            elapsed = time.perf_counter() - t0
            if outcome.error or outcome.reply_text != "ok":
                raise RuntimeError(f"{name}: turn failed: {outcome}")
            await asyncio.sleep(pause)
            if i >= warmup:
                got[name]["time"].append(elapsed)
                got[name]["cpu"].append(cpu["all"](name) - before)
                got[name]["worker_cpu"].append(cpu["worker"](name) - worker0)
    return got


async def run_on(client: Client, settings: KeelSettings, fake: FakeAnthropic,
                 args: argparse.Namespace) -> dict[str, Any]:
    data = Path(settings.data_dir)
    url_a = str(settings.database_url)
    with psycopg.connect(url_a, autocommit=True) as conn:
        conn.execute("CREATE DATABASE keel_b")
    urls = {"A": url_a, "B": make_conninfo(url_a, dbname="keel_b")}
    roots = {"A": Path(args.a).resolve(), "B": Path(args.b).resolve()}
    queues = {n: f"ab-{n}-{uuid.uuid4().hex[:6]}" for n in SERIES}
    procs = {n: start_worker(n, roots[n], urls[n], queues[n], client, fake, data)
             for n in SERIES}
    try:
        for n in SERIES:
            await wait_for_pollers(client, queues[n], 1)
            await wait_for_pollers(client, f"{queues[n]}-vault", 1)
        temporal = child_matching(os.getpid(), ["temporal", "start-dev"])
        pg = postmaster_pid(data / "postgres")
        assert temporal is not None and pg is not None
        cpu = {"worker": lambda n: cpu_seconds(procs[n].pid),
               "all": lambda n: cpu_seconds(procs[n].pid) + tree_cpu(pg) + cpu_seconds(
                   temporal)}
        sessions = {n: await KeelClient(client, queues[n], settings).start_session(
            f"ab-{n}-{uuid.uuid4().hex[:6]}", config=session_config(settings))
            for n in SERIES}
        got = await pairs(sessions, cpu, args.turns, args.warmup, args.pause)
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            p.wait(30)
    out: dict[str, Any] = {"roots": {n: str(r) for n, r in roots.items()},
                           "commits": {n: source_commit(r) for n, r in roots.items()}}
    for n in SERIES:
        times = got[n]["time"]
        out[n] = {"median_ms": round(statistics.median(times) * 1000, 2),
                  "p90_ms": round(percentile(times, 90) * 1000, 2),
                  "cpu_ms_mean": round(statistics.mean(got[n]["cpu"]) * 1000, 1),
                  "worker_cpu_ms_mean": round(statistics.mean(got[n]["worker_cpu"]) * 1000,
                                              1)}
    a, b = out["A"], out["B"]
    out["b_over_a"] = {k: round(b[k] / a[k], 3) for k in a}
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    cancel_on_sigterm()
    load0 = os.getloadavg()
    fake = FakeAnthropic(lambda body: text_message("ok")).start()
    model = ModelSettings(name="fake-model", base_url=fake.base_url, api_key="x",
                          request_timeout_s=30)
    out: dict[str, Any] = {"benchmark": "turn_ab", "machine": machine(), "turns": args.turns,
                           "pause_s": args.pause}
    try:
        async with bench_stack(model) as (client, settings):
            out.update(await run_on(client, settings, fake, args))
    finally:
        fake.stop()
    out["load_average"] = [round(x, 2) for x in (*load0, *os.getloadavg())]
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="checkout A (the before)")
    parser.add_argument("b", help="checkout B (the after)")
    parser.add_argument("--turns", type=int, default=80, help="pairs of calls")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--pause", type=float, default=0.25, help="seconds after each call")
    parser.add_argument("--out", default="turn-ab", help="results file name in bench/results")
    parsed = parser.parse_args()
    result = asyncio.run(main(parsed))
    for name in SERIES:
        r = result[name]
        print(f"{name} ({result['roots'][name]}): median {r['median_ms']} ms, p90 "
              f"{r['p90_ms']} ms; CPU per turn {r['cpu_ms_mean']} ms (worker "
              f"{r['worker_cpu_ms_mean']})")
    print(f"B / A: {result['b_over_a']}; load {result['load_average']}")
    print(f"figures written to {shown(write_json(parsed.out, result))}")
