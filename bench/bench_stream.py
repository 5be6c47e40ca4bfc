"""Streaming benchmark: what the event stream costs a turn, and how fast a delta arrives.

    .venv/bin/python bench/bench_stream.py            # ~1-2 min on 2 cores
    .venv/bin/python bench/bench_stream.py --quick    # a smoke run

One embedded stack (PostgreSQL + Temporal dev server), a fake Messages API answering at
once with a reply of `--chars` characters (streamed as SSE when asked), and two workers on
their own task queues, the same but for `ModelSettings.stream`. Turns alternate between:

  off     a session on the worker that does not stream (one create() call, no deltas)
  on      a session on the streaming worker, nobody subscribed
  on+sub  a session on the streaming worker with one subscriber (SessionHandle.events)

a. A turn's wall time (SessionHandle.ask: send + wait_reply) in each mode, side by side.
b. Delta latency: from a TextDelta leaving the model activity (its `at`, stamped when the
   batch is cut) to the subscriber receiving it, same host, same clock.

Figures go to stdout and bench/results/stream.json (stream-quick.json for --quick).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_runtime import bench_stack, finish, machine, ms  # noqa: E402
from bench.common import (  # noqa: E402
    cancel_on_sigterm,
    percentile,
    table,
)
from keel.client import KeelClient, SessionHandle  # noqa: E402
from schemas.config import ModelSettings  # noqa: E402
from schemas.events import TextDelta  # noqa: E402
from tests.fake_anthropic import FakeAnthropic, text_message  # noqa: E402
from workers.worker import build_worker  # noqa: E402

MODES = ("off", "on", "on+sub")


def say(text: str) -> None:
    print(text, flush=True)


async def subscribe(session: SessionHandle, latencies: list[float],
                    deltas_seen: list[int]) -> None:
    after = await session.event_offset()
    async for _, event in session.events(after=after):
        if isinstance(event, TextDelta):
            latencies.append((datetime.now(UTC) - event.at).total_seconds())
            deltas_seen[0] += 1


async def main(args: argparse.Namespace) -> dict[str, Any]:
    cancel_on_sigterm()
    reply = ("The quick brown fox jumps over the lazy dog. " * 200)[: args.chars]
    fake = FakeAnthropic(lambda body: text_message(reply)).start()
    model = ModelSettings(name="fake-model", base_url=fake.base_url, api_key="x",
                          request_timeout_s=30)
    out: dict[str, Any] = {"benchmark": "stream", "machine": machine(),
                           "reply_chars": args.chars, "turns_per_mode": args.turns,
                           "warmup": args.warmup}
    t0 = time.perf_counter()
    try:
        async with bench_stack(model) as (client, settings):
            streaming = settings
            plain = settings.model_copy(update={
                "task_queue": f"{settings.task_queue}-plain",
                "model": model.model_copy(update={"stream": False})})
            async with build_worker(client, streaming), build_worker(client, plain):
                sessions = {
                    "off": await KeelClient(client, plain.task_queue, plain)
                    .start_session(f"off-{uuid.uuid4().hex[:6]}"),
                    "on": await KeelClient(client, streaming.task_queue, streaming)
                    .start_session(f"on-{uuid.uuid4().hex[:6]}"),
                    "on+sub": await KeelClient(client, streaming.task_queue, streaming)
                    .start_session(f"sub-{uuid.uuid4().hex[:6]}"),
                }
                latencies: list[float] = []
                deltas_seen = [0]
                reader = asyncio.create_task(subscribe(sessions["on+sub"], latencies,
                                                       deltas_seen))
                times: dict[str, list[float]] = {m: [] for m in MODES}
                say(f"stack up; {args.warmup} warm-up + {args.turns} turns per mode, "
                    f"reply {args.chars} chars...")
                for i in range(args.warmup + args.turns):
                    for mode in MODES if i % 2 == 0 else reversed(MODES):
                        start = time.perf_counter()
                        outcome = await sessions[mode].ask(f"turn {i}")
                        took = time.perf_counter() - start
                        assert outcome.reply_text == reply, outcome
                        if i >= args.warmup:
                            times[mode].append(took)
                    if i + 1 == args.warmup:
                        latencies.clear()
                await asyncio.sleep(1.0)  # the last deltas reach the reader
                reader.cancel()
    finally:
        fake.stop()
    out["turn_ms"] = {m: {"median": ms(percentile(v, 50)), "p90": ms(percentile(v, 90)),
                          "n": len(v)} for m, v in times.items()}
    out["streaming_overhead_median_ms"] = ms(percentile(times["on"], 50)
                                             - percentile(times["off"], 50))
    out["subscriber_overhead_median_ms"] = ms(percentile(times["on+sub"], 50)
                                              - percentile(times["on"], 50))
    out["delta_latency_ms"] = {"median": ms(percentile(latencies, 50)),
                               "p90": ms(percentile(latencies, 90)),
                               "max": ms(max(latencies) if latencies else float("nan")),
                               "n": len(latencies)}
    out["deltas_per_turn"] = round(deltas_seen[0] / max(1, args.turns + args.warmup), 1)
    out["total_seconds"] = round(time.perf_counter() - t0, 1)
    return out


def report(out: dict[str, Any]) -> None:
    t = out["turn_ms"]
    say("")
    say(table(f"a. One turn (ask = send + wait_reply), fake model, reply of "
              f"{out['reply_chars']} chars, {out['turns_per_mode']} turns per mode",
              ["mode", "median ms", "p90 ms"],
              [["off: no streaming (create)", t["off"]["median"], t["off"]["p90"]],
               ["on: streamed, deltas published, nobody subscribed", t["on"]["median"],
                t["on"]["p90"]],
               ["on+sub: streamed, one subscriber", t["on+sub"]["median"],
                t["on+sub"]["p90"]]]))
    say(f"   streaming costs {out['streaming_overhead_median_ms']} ms a turn (median); a "
        f"subscriber {out['subscriber_overhead_median_ms']} ms more")
    d = out["delta_latency_ms"]
    say("")
    say(table("b. Delta latency: TextDelta cut in the activity -> the subscriber has it",
              ["median ms", "p90 ms", "max ms", "deltas", "deltas a turn"],
              [[d["median"], d["p90"], d["max"], d["n"], out["deltas_per_turn"]]]))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=40, help="measured turns per mode")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--chars", type=int, default=2000, help="the reply's length")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    args.name = "stream"
    if args.quick:
        args.turns, args.warmup, args.name = 8, 1, "stream-quick"
    return args


if __name__ == "__main__":
    arguments = parse_args()
    result = asyncio.run(main(arguments))
    report(result)
    finish(arguments.name, result)
