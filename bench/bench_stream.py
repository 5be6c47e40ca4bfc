"""Streaming benchmark: what the event stream costs a turn, and how fast a delta arrives.

    .venv/bin/python bench/bench_stream.py            # ~40 s on 2 cores
    .venv/bin/python bench/bench_stream.py --quick    # a smoke run

One embedded stack (PostgreSQL + Temporal dev server), a fake Messages API answering at
once with a reply of `--chars` characters (streamed as SSE when asked), and two workers on
their own task queues, the same but for `ModelSettings.stream`. Turns alternate between:

  off     a session on the worker that does not stream (one create() call, no deltas)
  on      a session on the streaming worker, nobody subscribed (so no delta is sent)
  on+sub  a session on the streaming worker with one subscriber (SessionHandle.events)

a. A turn's wall time (SessionHandle.ask: send + wait_reply) in each mode, side by side.
b. Delta latency: from a TextDelta leaving the model activity (its `at`, stamped when the
   batch is cut) to the subscriber receiving it, same host, same clock.
c. A reply written as a model writes (`--paced` seconds between the fake's streamed events,
   three words each: 2,000 characters in ~2.7 s at 0.02), `--paced-turns` turns in the
   `on` and `on+sub` sessions: history events, workflow tasks and publish signals a turn,
   read from the sessions' histories.

Figures go to stdout and bench/results/stream.json (stream-quick.json for --quick).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    cancel_on_sigterm,
    percentile,
    table,
)
from bench.stack import bench_stack, finish, machine, ms  # noqa: E402
from keel.client import KeelClient, SessionHandle  # noqa: E402
from schemas.config import ModelSettings  # noqa: E402
from schemas.events import TextDelta  # noqa: E402
from tests.fake_anthropic import FakeAnthropic, text_message  # noqa: E402
from workers.worker import build_worker  # noqa: E402
from workflows.events import STREAM_PUBLISH  # noqa: E402

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
                out["paced"] = await paced(client, fake, sessions, args)
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


async def history_counts(client: Any, session_id: str) -> Counter[str]:
    history = await client.get_workflow_handle(session_id).fetch_history()
    counts: Counter[str] = Counter(events=len(history.events))
    for e in history.events:
        if e.HasField("workflow_task_completed_event_attributes"):
            counts["tasks"] += 1
        if (e.HasField("workflow_execution_signaled_event_attributes")
                and e.workflow_execution_signaled_event_attributes.signal_name
                == STREAM_PUBLISH):
            counts["signals"] += 1
    return counts


async def paced(client: Any, fake: FakeAnthropic, sessions: dict[str, SessionHandle],
                args: argparse.Namespace) -> dict[str, Any]:
    """Per turn, in a session nobody reads and in one with a subscriber, when the reply
    takes seconds to write: what its history holds."""
    fake.stream_delay_s = args.paced
    out: dict[str, Any] = {"delay_s": args.paced, "turns": args.paced_turns}
    try:
        for mode in ("on", "on+sub"):
            before = await history_counts(client, sessions[mode].session_id)
            start = time.perf_counter()
            for i in range(args.paced_turns):
                await sessions[mode].ask(f"paced {i}")
            took = (time.perf_counter() - start) / args.paced_turns
            after = await history_counts(client, sessions[mode].session_id)
            out[mode] = {"turn_s": round(took, 2), **{
                f"{k}_per_turn": round((after[k] - before[k]) / args.paced_turns, 1)
                for k in ("events", "tasks", "signals")}}
    finally:
        fake.stream_delay_s = 0.0
    return out


def report(out: dict[str, Any]) -> None:
    t = out["turn_ms"]
    say("")
    say(table(f"a. One turn (ask = send + wait_reply), fake model, reply of "
              f"{out['reply_chars']} chars, {out['turns_per_mode']} turns per mode",
              ["mode", "median ms", "p90 ms"],
              [["off: no streaming (create)", t["off"]["median"], t["off"]["p90"]],
               ["on: streamed, nobody subscribed", t["on"]["median"],
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
    pc = out["paced"]
    say("")
    say(table(f"c. A reply written over seconds ({pc['delay_s']} s between streamed events), "
              f"{pc['turns']} turns: per turn",
              ["mode", "turn s", "history events", "workflow tasks", "publish signals"],
              [[mode, pc[mode]["turn_s"], pc[mode]["events_per_turn"],
                pc[mode]["tasks_per_turn"], pc[mode]["signals_per_turn"]]
               for mode in ("on", "on+sub")]))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=40, help="measured turns per mode")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--chars", type=int, default=2000, help="the reply's length")
    p.add_argument("--paced", type=float, default=0.02,
                   help="seconds between the fake's streamed events in part c")
    p.add_argument("--paced-turns", type=int, default=3)
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
