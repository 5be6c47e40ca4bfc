"""Runtime benchmark: what the harness itself costs, on the embedded stack.

    .venv/bin/python bench/bench_runtime.py            # all four parts, ~10-20 min on 2 cores
    .venv/bin/python bench/bench_runtime.py --quick    # fewer turns, for a smoke run
    .venv/bin/python bench/bench_runtime.py --parts ad --name before/runtime-floor-<sha>

a. A plain turn beside Temporal's floor: Keel's plain turn (SessionHandle.ask, one update,
   fake Messages API answering at once) and the floor (a minimal workflow: an Update that
   runs one activity calling the same fake through the `anthropic` SDK), alternating on the
   same stack; median and p90 of each, their ratio (bar: <= 1.5x), and history events and
   workflow tasks per turn counted from the real histories (bar: <= 20 events per plain
   turn). Run with the reply streamed (the default; a short reply's text comes with the
   reply, no publish signal) and with KEEL_STREAM=0, each on a worker of its own. Beside
   it, bare SDK calls (minimal request, Keel's own last request).
b. Context rebuild: SessionContext.windows.load + assemble_messages for a live window of
   the last 40 rows, for a session of 100 and of 100,000 recorded messages (bulk COPY).
c. Workflow history: 1,000 turns, then the current run's history length, the number of
   runs (continue-as-new) and the longest run.
d. Flat cost: a plain turn at 100 and at 20,000 transcript entries today (two memory scopes,
   their daily files seeded and indexed) and at 10 and 50,000 workspace files (written
   straight into the store), alternating; then the steps that could grow, called directly:
   append_transcripts and recall_memory at both days, system_prompt at both workspace sizes
   in the LocalStore and the PostgresStore (COPY of the rows).

Everything runs in a temporary data folder (embedded PostgreSQL + Temporal dev server),
which is stopped and removed at the end. Figures go to stdout and bench/results/runtime.json.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import cancel_on_sigterm  # noqa: E402
from bench.runtime_flat import bench_flat, report_flat  # noqa: E402
from bench.runtime_record import (  # noqa: E402
    bench_history,
    bench_rebuild,
    report_history,
    report_rebuild,
)
from bench.runtime_turn import bench_turn_overhead, report_turn  # noqa: E402
from bench.stack import bench_stack, finish, machine, say  # noqa: E402
from schemas.config import ModelSettings  # noqa: E402
from tests.fake_anthropic import FakeAnthropic, text_message  # noqa: E402
from workers.worker import build_worker  # noqa: E402

# ----- main ---------------------------------------------------------------------------------

async def main(args: argparse.Namespace) -> dict[str, Any]:
    cancel_on_sigterm()
    fake = FakeAnthropic(lambda body: text_message("ok")).start()
    model = ModelSettings(name="fake-model", base_url=fake.base_url, api_key="x",
                          request_timeout_s=30)
    out: dict[str, Any] = {"benchmark": "runtime", "machine": machine()}
    try:
        t0 = time.perf_counter()
        async with bench_stack(model) as (client, settings):
            out["stack_start_seconds"] = round(time.perf_counter() - t0, 1)
            worker = build_worker(client, settings)
            async with worker:
                say(f"stack up in {out['stack_start_seconds']} s")
                if "a" in args.parts:
                    say(f"a. a plain turn beside the floor ({args.turns} turns each)...")
                    out["turn_overhead"] = await bench_turn_overhead(
                        client, settings, fake, args.turns, args.warmup)
                if "b" in args.parts:
                    say("b. context rebuild (bulk-loading the sessions)...")
                    out["rebuild"] = await bench_rebuild(settings, args.sizes,
                                                         args.rebuild_runs)
                if "c" in args.parts:
                    say(f"c. workflow history ({args.history_turns} turns, "
                        "continue_as_new_after_events=0)...")
                    first = await bench_history(client, settings, fake, args.history_turns,
                                                0, say)
                    out["history"] = [first]
                    if first["runs"] == 1 or args.with_limit:
                        say(f"   ... and with continue_as_new_after_events={args.limit}")
                        out["history"].append(await bench_history(
                            client, settings, fake, args.history_turns, args.limit, say))
                if "d" in args.parts:
                    say(f"d. flat cost: {args.day_sizes} transcript entries today, "
                        f"{args.file_sizes} workspace files...")
                    out["flat"] = await bench_flat(
                        client, settings, fake, args.day_sizes, args.file_sizes,
                        args.flat_turns, args.rebuild_runs, say)
            if "a" in args.parts:
                # The same without the reply's text deltas (KEEL_STREAM=0), on a worker of its
                # own once the first has stopped (two workers in one process slow both).
                plain = settings.model_copy(update={
                    "task_queue": f"{settings.task_queue}-unstreamed",
                    "model": settings.model.model_copy(update={"stream": False})})
                say("   ... and with the reply's text deltas off (KEEL_STREAM=0)")
                async with build_worker(client, plain):
                    out["turn_overhead_unstreamed"] = await bench_turn_overhead(
                        client, plain, fake, args.turns, args.warmup)
    finally:
        fake.stop()
    out["total_seconds"] = round(time.perf_counter() - t0, 1)
    return out


def report(out: dict[str, Any]) -> None:
    if "turn_overhead" in out:
        report_turn(out["turn_overhead"], "reply streamed, the default")
    if "turn_overhead_unstreamed" in out:
        report_turn(out["turn_overhead_unstreamed"], "KEEL_STREAM=0")
    if "rebuild" in out:
        report_rebuild(out["rebuild"])
    if "history" in out:
        report_history(out["history"])
    if "flat" in out:
        report_flat(out["flat"])


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=100, help="measured turns for part a")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 100_000])
    p.add_argument("--rebuild-runs", type=int, default=30)
    p.add_argument("--history-turns", type=int, default=1000)
    p.add_argument("--limit", type=int, default=2000,
                   help="continue_as_new_after_events of the second history run")
    p.add_argument("--with-limit", action="store_true",
                   help="run the second history run even when the first continued-as-new")
    p.add_argument("--day-sizes", type=int, nargs="+", default=[100, 20_000],
                   help="transcript entries today for part d")
    p.add_argument("--file-sizes", type=int, nargs="+", default=[10, 50_000],
                   help="workspace files for part d")
    p.add_argument("--flat-turns", type=int, default=30, help="turns per case in part d")
    p.add_argument("--parts", default="abcd",
                   help="which parts to run (letters of the docstring's list)")
    p.add_argument("--name", default=None, help="results file name (default: runtime)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run (20 turns, 1k rows...), written to runtime-quick.json")
    args = p.parse_args()
    quick_name = "runtime-quick"
    if args.quick:
        args.turns, args.warmup, args.sizes = 20, 2, [100, 1_000]
        args.rebuild_runs, args.history_turns = 5, 100
        args.day_sizes, args.file_sizes, args.flat_turns = [100, 2_000], [10, 2_000], 5
    # A quick run never overwrites the full run's figures.
    args.name = args.name or (quick_name if args.quick else "runtime")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    result = asyncio.run(main(arguments))
    report(result)
    finish(arguments.name, result)
