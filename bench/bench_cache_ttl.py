"""What the prompt cache's lifetime costs a session, by how far apart its inputs come.

    .venv/bin/python bench/bench_cache_ttl.py [--turns 24] [--out PATH]

Real sessions (Keel's worker in this process, Temporal's time-skipping test server so a
gap of an hour passes at once, an embedded PostgreSQL) against the fake Messages API, whose
clock is moved with Temporal's: its cache entries expire as the real API's do (five
minutes, or an hour, from the last read). Each cadence is played by two sessions, one with
the default lifetime policy (`auto`, schemas.cache_ttl) and one held to five minutes:

- busy: 30 s between turns (an agent at work: five minutes never lapse);
- watch: a Watch every 10 minutes;
- person: a person replying after 1 to 30 minutes (drawn, the same draws both sides);
- bursts: a person at work, 20 s between turns, and a 15-minute break every sixth gap;
- sparse: 90 minutes between turns (an hour lapses too).

Every turn is a Task input answered with a 200-word reply, over 3,000 words of
instructions, so the context grows as a conversation does. Printed and written
(`bench/results/cache-ttl.json`): the dollars of input the API's usage bills at Sonnet's
list prices (input $3, a five-minute write $3.75, an hour's $6, a read $0.30 a million) and
the share of input read from the cache, each way, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.db import apply_migrations, close_pools
from bench.common import ROOT, shown, source_commit, table
from bench.stack import machine
from keel.client import KeelClient, session_config
from keel.devstack import temporal_test_server_path, temporary_postgres
from schemas.agent import AgentSpec
from schemas.budget import DEFAULT_PRICES, cost_usd
from schemas.cache_ttl import CacheTtl
from schemas.messages import Usage
from tests.fake_anthropic import CacheUsage, FakeAnthropic, ManualClock, text_message
from tests.harness import make_settings
from workers.worker import build_worker

RESULTS = ROOT / "bench" / "results" / "cache-ttl.json"
PRICE = DEFAULT_PRICES["claude-sonnet"]
SPEC = AgentSpec(instructions=" ".join(
    f"Rule {i}: keep the release notes of component {i} short, dated and linked."
    for i in range(250)))
REPLY = " ".join(f"word{i % 50}" for i in range(200))


def cadences(turns: int) -> dict[str, list[float]]:
    """The gaps before turns 2.. of each cadence, in seconds."""
    draws = random.Random(7)
    return {"busy": [30.0] * (turns - 1), "watch": [600.0] * (turns - 1),
            "person": [draws.uniform(60, 1800) for _ in range(turns - 1)],
            "bursts": [900.0 if i % 6 == 5 else 20.0 for i in range(turns - 1)],
            "sparse": [5400.0] * (turns - 1)}


def billed(usages: list[CacheUsage]) -> dict[str, Any]:
    usage = [Usage(input_tokens=u.input, cache_read_input_tokens=u.cache_read,
                   cache_creation_input_tokens=u.cache_creation,
                   cache_creation_1h_input_tokens=u.creation_1h) for u in usages]
    read = sum(u.cache_read for u in usages)
    total = sum(u.total_input for u in usages)
    return {"input_usd": round(sum(cost_usd(u, PRICE) for u in usage), 4),
            "cache_read_share": round(read / total, 4) if total else 0.0,
            "written_5m": sum(u.creation_5m for u in usages),
            "written_1h": sum(u.creation_1h for u in usages), "read": read,
            "requests": len(usages)}


def _replies(database_url: str, session_id: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM messages WHERE session_id = %s"
                           " AND type = 'assistant'", (session_id,)).fetchone()
    return int(row[0]) if row else 0


async def play(keel: KeelClient, env: WorkflowEnvironment, fake: FakeAnthropic,
               clock: ManualClock, database_url: str, name: str, gaps: list[float],
               mode: CacheTtl) -> dict[str, Any]:
    fake.cache.clear()
    session = await keel.start_session(
        f"{name}-{mode.name.lower()}", agent=SPEC,
        config=session_config(keel.settings, prompt_cache_ttl=mode, memory_scope=None))
    first = len(fake.usages)
    for turn, gap in enumerate([0.0, *gaps], start=1):
        if gap:
            await env.sleep(gap)
            clock.advance(gap)
        await session.task(f"t{turn}", "Release watch", f"check {turn}: what changed?")
        deadline = time.monotonic() + 60
        while _replies(database_url, session.session_id) < turn:
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}/{mode}: turn {turn} got no reply")
            await asyncio.sleep(0.05)
    return billed(fake.usages[first:])


async def run(turns: int) -> dict[str, Any]:
    clock = ManualClock(1_000.0)
    fake = FakeAnthropic(lambda body: text_message(REPLY), clock=clock).start()
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=temporal_test_server_path())
    try:
        with temporary_postgres("keel-bench-pg-") as url, \
                tempfile.TemporaryDirectory(prefix="keel-bench-ttl-") as tmp:
            apply_migrations(url)
            settings = make_settings(url, Path(tmp), fake.base_url)
            async with build_worker(env.client, settings):
                keel = KeelClient(env.client, settings.task_queue, settings)
                out: dict[str, Any] = {}
                for name, gaps in cadences(turns).items():
                    auto = await play(keel, env, fake, clock, url, name, gaps, CacheTtl.AUTO)
                    short = await play(keel, env, fake, clock, url, name, gaps,
                                       CacheTtl.SHORT)
                    out[name] = {"median_gap_s": round(sorted(gaps)[len(gaps) // 2]), "auto": auto,
                                 "five_minutes": short, "auto_over_five_minutes": round(
                                     auto["input_usd"] / short["input_usd"], 3)}
            await close_pools()
    finally:
        await env.shutdown()
        fake.stop()
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=24, help="turns a session")
    parser.add_argument("--out", type=Path, help="results file (default: "
                        "bench/results/cache-ttl.json for the default run)")
    args = parser.parse_args()
    commit = source_commit()  # the code measured: read before the run
    started = time.perf_counter()
    figures = await run(args.turns)
    print(table("Input billed over a session by its cadence (Sonnet list prices)",
                ["cadence", "median gap s", "auto $", "5m only $", "auto / 5m",
                 "read share auto", "read share 5m"],
                [[name, f["median_gap_s"], f["auto"]["input_usd"],
                  f["five_minutes"]["input_usd"], f["auto_over_five_minutes"],
                  f["auto"]["cache_read_share"], f["five_minutes"]["cache_read_share"]]
                 for name, f in figures.items()]))
    out = {"benchmark": "cache-ttl",
           "machine": {**machine(), "commit": commit},
           "turns": args.turns, "cadences": figures,
           "total_seconds": round(time.perf_counter() - started, 1)}
    path = args.out or (RESULTS if args.turns == 24 else
                        RESULTS.with_name("cache-ttl-custom.json"))
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"total {out['total_seconds']} s at commit {commit}; written to {shown(path)}")


if __name__ == "__main__":
    asyncio.run(main())
