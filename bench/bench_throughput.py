"""Throughput benchmark: agent turns per second and the median turn's latency with 1 and 3
session worker processes (plus the one vault worker) at 10 and 50 concurrent sessions.

    .venv/bin/python bench/bench_throughput.py          # 4 runs, 3 timed turns a session
    .venv/bin/python bench/bench_throughput.py --quick  # one small run, nothing written

The stack is the embedded one (Temporal dev server, embedded PostgreSQL) in a temporary
folder; the workers are real `python -m workers.main` processes on a fresh task queue per
run, with the PostgreSQL workspace store, as on a cluster. The model is the fake Messages
API answering at once, so a turn costs only Keel: the user's update, the model activity
(the record step, long memory's recall, the window, the reply's insert), the workflow
tasks, and after the reply the transcript the vault worker appends and indexes. Each
session plays its turns back to back after a warm-up turn; a run's clock starts when every
session is warm and stops when all are done (turns/s = timed turns / that time; latency =
send to reply of each timed turn). CPU seconds of every process of the run (the workers,
the Temporal dev server, PostgreSQL, this process with the client and the fake model; from
/proc) say what limits each run.
Figures go to stdout and bench/results/throughput.json.
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


from bench.common import cancel_on_sigterm, percentile, table  # noqa: E402
from bench.procs import cpu_seconds, stack_processes, tree_cpu  # noqa: E402
from bench.stack import bench_stack, machine, write_json  # noqa: E402
from keel._queues import pollers  # noqa: E402
from keel.client import KeelClient  # noqa: E402
from schemas.config import ModelSettings  # noqa: E402
from tests.fake_anthropic import FakeAnthropic, text_message  # noqa: E402

CONFIGS = [(1, 10), (1, 50), (3, 10), (3, 50)]  # (session workers, concurrent sessions)
TICK = os.sysconf("SC_CLK_TCK")


def stack_cpu(settings: Any) -> dict[str, float]:
    """CPU seconds so far of the stack's own processes: the Temporal dev server and
    PostgreSQL (its postmaster and every backend)."""
    pids = stack_processes(Path(settings.data_dir))
    return {"temporal_server": cpu_seconds(pids["temporal_server"]),
            "postgres": tree_cpu(pids["postgres"])}


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / TICK, sum(values) / TICK


async def wait_for_pollers(client: Any, queue: str, count: int) -> None:
    for _ in range(1800):  # a loaded machine starts Python processes slowly
        if len(await pollers(client, queue, activities=True)) >= count:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{queue}: fewer than {count} pollers")


async def run_config(client: Any, settings: Any, workers: int, sessions: int,
                     turns: int) -> dict[str, Any]:
    queue = f"tp-{workers}w-{sessions}s-{uuid.uuid4().hex[:6]}"
    data = Path(settings.data_dir)
    env = {**os.environ, "TEMPORAL_ADDRESS": client.service_client.config.target_host,
           "DATABASE_URL": settings.database_url, "KEEL_TASK_QUEUE": queue,
           "ANTHROPIC_BASE_URL": settings.model.base_url, "ANTHROPIC_API_KEY": "x",
           "KEEL_MODEL": "fake-model", "KEEL_VAULT_PUSH": "0", "KEEL_LOG_LEVEL": "WARNING"}

    def start(role: str, name: str) -> subprocess.Popen:
        folder = data / queue / name
        folder.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen([sys.executable, "-m", "workers.main", role], cwd=ROOT,
                                env={**env, "KEEL_DATA_DIR": str(folder)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    vault = start("vault", "vault")
    procs = [start("sessions", f"w{i}") for i in range(workers)]
    try:
        await wait_for_pollers(client, queue, workers)
        await wait_for_pollers(client, f"{queue}-vault", 1)
        keel = KeelClient(client, queue, settings.model_copy(update={"task_queue": queue}))
        latencies: list[float] = []
        go = asyncio.Event()

        async def play(n: int) -> None:
            session = await keel.start_session(f"{queue}-{n}")
            await session.ask("warm-up")
            await go.wait()
            for k in range(turns):
                t0 = time.perf_counter()
                await session.ask(f"turn {k}")
                latencies.append(time.perf_counter() - t0)

        players = [asyncio.create_task(play(n)) for n in range(sessions)]
        # The clock starts once every session has had its warm-up turn answered.
        while not await _all_warm(queue, sessions):
            failed = [err for p in players if p.done() and (err := p.exception())]
            if failed:
                raise failed[0]
            await asyncio.sleep(0.2)
        cpu0 = {p.pid: cpu_seconds(p.pid) for p in [vault, *procs]}
        stack0 = stack_cpu(settings)
        own0, (busy0, total0) = time.process_time(), machine_busy()
        t_start = time.perf_counter()
        go.set()
        await asyncio.gather(*players)
        elapsed = time.perf_counter() - t_start
        busy1, total1 = machine_busy()
        cpu = {p.pid: cpu_seconds(p.pid) - cpu0[p.pid] for p in [vault, *procs]}
        stack = {k: v - stack0[k] for k, v in stack_cpu(settings).items()}
        own = time.process_time() - own0
        counted = len(latencies)
    finally:
        for p in [vault, *procs]:
            p.terminate()
        for p in [vault, *procs]:
            p.wait(30)
    cores = os.cpu_count() or 1
    busy_share = (busy1 - busy0) / max(total1 - total0, 1e-9)
    session_cpu = sum(cpu[p.pid] for p in procs)
    return {
        "session_workers": workers, "sessions": sessions, "seconds": round(elapsed, 1),
        "turns_per_session": turns,
        "turns": counted, "turns_per_second": round(counted / elapsed, 1),
        "median_turn_ms": round(statistics.median(latencies) * 1000, 1) if latencies else None,
        "p90_turn_ms": round(percentile(latencies, 90) * 1000, 1) if latencies else None,
        "cpu_seconds": {
            "session_workers": round(session_cpu, 1),
            "per_session_worker": [round(cpu[p.pid], 1) for p in procs],
            "vault_worker": round(cpu[vault.pid], 1),
            "temporal_server": round(stack["temporal_server"], 1),
            "postgres": round(stack["postgres"], 1),
            "bench_process (client + fake model)": round(own, 1),
        },
        "machine_busy_percent": round(100 * busy_share, 0),
        "machine_cores": cores,
        "cpu_ms_per_turn": {
            "session_workers": round(1000 * session_cpu / max(counted, 1), 1),
            "vault_worker": round(1000 * cpu[vault.pid] / max(counted, 1), 1),
            "temporal_server": round(1000 * stack["temporal_server"] / max(counted, 1), 1),
            "postgres": round(1000 * stack["postgres"] / max(counted, 1), 1),
            "bench_process": round(1000 * own / max(counted, 1), 1),
            "all": round(1000 * (session_cpu + cpu[vault.pid] + sum(stack.values()) + own)
                         / max(counted, 1), 1),
        },
    }


async def _all_warm(queue: str, sessions: int) -> bool:
    """Every session has had its warm-up turn answered (a reply in the record)."""
    from activities.db import get_pool

    pool = await get_pool(_DB["url"])
    async with pool.connection() as conn:
        row = await (await conn.execute(
            "SELECT count(DISTINCT session_id) FROM messages WHERE session_id LIKE %s"
            " AND type='assistant'", (f"{queue}-%",))).fetchone()
    return bool(row and row[0] >= sessions)


_DB: dict[str, str] = {}


def limit_of(r: dict[str, Any]) -> str:
    """What held the run back, from where the CPU went: the machine's cores when the
    processes measured kept them nearly all busy (naming the largest users), one process
    when it kept a core busy, else the chain of round trips a turn waits on."""
    cores, seconds = r["machine_cores"], r["seconds"]
    cpu = r["cpu_seconds"]
    users = {"Temporal server": cpu["temporal_server"], "PostgreSQL": cpu["postgres"],
             "session workers": cpu["session_workers"], "vault worker": cpu["vault_worker"],
             "client + fake model": cpu["bench_process (client + fake model)"]}
    busy = sum(users.values()) / seconds  # cores the measured processes kept busy
    largest = ", ".join(f"{name} {used / seconds:.2f}" for name, used in
                        sorted(users.items(), key=lambda kv: -kv[1])[:3])
    one = max([*cpu["per_session_worker"], cpu["vault_worker"]]) / seconds
    if busy >= 0.8 * cores or r["machine_busy_percent"] >= 90:
        return f"the machine's {cores} cores ({busy:.2f} busy with this run: {largest})"
    if one >= 0.85:
        return f"one Python worker's core ({one:.0%})"
    return (f"latency: each turn is a chain of round trips ({busy:.2f} cores busy: "
            f"{largest})")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    cancel_on_sigterm()
    fake = FakeAnthropic(lambda body: text_message("ok")).start()
    model = ModelSettings(name="fake-model", base_url=fake.base_url, api_key="x",
                          request_timeout_s=30)
    out: dict[str, Any] = {"benchmark": "throughput", "machine": machine(),
                           "turns_per_session": args.turns, "runs": []}
    try:
        async with bench_stack(model) as (client, settings):
            assert settings.database_url is not None  # bench_stack sets it
            _DB["url"] = settings.database_url
            for workers, sessions in ([(1, 10)] if args.quick else CONFIGS):
                print(f"{workers} session worker(s), {sessions} sessions, "
                      f"{args.turns} turns each...", flush=True)
                try:
                    run = await run_config(client, settings, workers, sessions, args.turns)
                except Exception as err:  # a run that breaks the stack is a figure too
                    out["runs"].append({"session_workers": workers, "sessions": sessions,
                                        "error": f"{type(err).__name__}: {err}"})
                    print(f"   failed: {err}", flush=True)
                    break
                run["limited_by"] = limit_of(run)
                out["runs"].append(run)
                print(f"   {run['turns_per_second']} turns/s, median "
                      f"{run['median_turn_ms']} ms", flush=True)
                if not args.quick:  # written after every run: a later failure keeps these
                    write_json("throughput", out)
    finally:
        fake.stop()
    return out


def report(out: dict[str, Any]) -> None:
    print()
    print(table(
        f"Turns per second, fake model answering at once ({out['turns_per_session']} turns "
        f"per session after a warm-up turn, "
        f"{out['machine']['cpus']} cores, plus one vault worker in every run)",
        ["session workers", "sessions", "turns/s", "median ms", "p90 ms",
         "CPU ms/turn: all", "sessions", "vault", "Temporal", "PostgreSQL", "client+fake",
         "machine busy", "limited by (cores used)"],
        [[r["session_workers"], r["sessions"], r["turns_per_second"], r["median_turn_ms"],
          r["p90_turn_ms"], *(r["cpu_ms_per_turn"][k] for k in (
              "all", "session_workers", "vault_worker", "temporal_server", "postgres",
              "bench_process")),
          f"{r['machine_busy_percent']:.0f}%", r["limited_by"]]
         for r in out["runs"] if "error" not in r]))
    for r in out["runs"]:
        if "error" in r:
            print(f"{r['session_workers']} workers, {r['sessions']} sessions: {r['error']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=3, help="turns per session, timed")
    parser.add_argument("--quick", action="store_true", help="one run (1 worker, 10 "
                        "sessions), results not written")
    cli = parser.parse_args()
    result = asyncio.run(main(cli))
    report(result)
    if not cli.quick:
        print(f"\nwritten to {write_json('throughput', result)}")
