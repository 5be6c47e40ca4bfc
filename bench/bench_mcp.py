"""What an MCP call costs over the server's own time, cold (a process per call, as every call
was before the pool) and warm (the worker's pool), what a large result costs over stdio, and
what a workspace write costs in a scope of 10 and of 50,000 files (PostgreSQL store).

The MCP figures run the activities themselves (temporalio's ActivityEnvironment, no
Temporal server) against the real stdio server tests/mcp/servers/pool_server.py, whose
`timed` tool reports its own handler's duration: overhead = the activity's wall time minus
that. Cold and warm calls take turns, so a change of the machine's load weighs on both.
The workspace figures write small files through `PostgresStore.write` into two scopes seeded
by COPY on an embedded PostgreSQL, alternately.

Runs against whatever code is imported: the checkout, or with `PYTHONPATH=<an older tree>`
(this script and the pool server copied into it) that tree, whose missing parts (the pool, a
kept result) are reported as missing; so the same script gives before and after.

    python bench/bench_mcp.py [--calls N] [--writes N] [--big 1,8,64] [--out NAME]
                              [--commit SHA]
        -> prints figures, writes bench/results/<NAME>.json (default mcp.json)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from temporalio.testing import ActivityEnvironment  # noqa: E402

from activities.mcp import CallMcpToolInput, ListMcpToolsInput, McpActivities  # noqa: E402
from bench.common import percentile, source_commit, table  # noqa: E402
from schemas.mcp import McpServerSpec, McpStdio  # noqa: E402

POOL_SERVER = str(ROOT / "tests" / "mcp" / "servers" / "pool_server.py")
SPEC = McpServerSpec(name="pool", stdio=McpStdio(command=sys.executable, args=[POOL_SERVER]),
                     connect_s=60, list_s=60, call_s=600)


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def summary(values: list[float]) -> dict[str, float]:
    return {"median_ms": ms(statistics.median(values)), "p90_ms": ms(percentile(values, 90)),
            "min_ms": ms(min(values)), "n": len(values)}


def the_pool() -> Any:
    try:
        from activities.mcp_pool import McpPool
    except ImportError:
        return None
    return McpPool()


async def timed_call(acts: McpActivities, session_id: str) -> tuple[float, float]:
    """(wall seconds, the server's own seconds) of one `timed` call through the activity."""
    started = time.perf_counter()
    result = await ActivityEnvironment().run(acts.call_mcp_tool, CallMcpToolInput(
        server=SPEC, tool="timed", arguments={"ms": 0}, session_id=session_id))
    wall = time.perf_counter() - started
    if result.is_error:
        raise RuntimeError(result.text)
    return wall, json.loads(result.text)["server_ms"] / 1000


async def listing(acts: McpActivities, session_id: str, refresh: bool = False) -> float:
    started = time.perf_counter()
    await ActivityEnvironment().run(acts.list_mcp_tools, ListMcpToolsInput(
        server=SPEC, session_id=session_id, refresh=refresh))
    return time.perf_counter() - started


async def bench_calls(calls: int) -> dict[str, Any]:
    cold_acts = McpActivities()
    pool = the_pool()
    warm_acts = McpActivities(pool) if pool is not None else None
    cold: list[float] = []
    warm: list[float] = []
    server: list[float] = []
    lists: dict[str, list[float]] = {"cold": [], "warm (cached)": []}
    try:
        if warm_acts is not None:
            await timed_call(warm_acts, "bench")  # the one cold start of the warm path
        for n in range(calls):
            wall, own = await timed_call(cold_acts, "bench-cold")
            cold.append(wall - own)
            server.append(own)
            if warm_acts is not None:
                for _ in range(10):  # ten warm calls per cold one: they are that much cheaper
                    wall, own = await timed_call(warm_acts, "bench")
                    warm.append(wall - own)
                    server.append(own)
            if n < max(3, calls // 4):
                lists["cold"].append(await listing(cold_acts, ""))
                if warm_acts is not None:
                    lists["warm (cached)"].append(await listing(warm_acts, "bench"))
    finally:
        if pool is not None:
            await pool.close()
    out: dict[str, Any] = {"cold_call_overhead": summary(cold),
                           "server_own_time": summary(server),
                           "cold_listing": summary(lists["cold"])}
    if warm:
        out["warm_call_overhead"] = summary(warm)
        out["warm_listing_cached"] = summary(lists["warm (cached)"])
    else:
        out["warm_call_overhead"] = "no pool in this tree"
    return out


async def bench_big(sizes_mb: list[int]) -> dict[str, Any]:
    """One call per size returning that many million characters, warm where a pool exists,
    with a workspace store to keep the whole text where the code can."""
    folder = Path(tempfile.mkdtemp(prefix="keel-bench-mcp-"))
    pool = the_pool()
    try:
        from activities.workspace import LocalStore

        store = LocalStore(folder / "workspaces", folder, 1 << 30, 1 << 31)
        try:
            acts = McpActivities(pool, store=lambda: store) if pool is not None \
                else McpActivities()
        except TypeError:
            acts = McpActivities()
        out: dict[str, Any] = {}
        if pool is not None:
            await timed_call(acts, "bench-big")
        for size in sizes_mb:
            chars = size * 1_000_000
            started = time.perf_counter()
            result = await ActivityEnvironment().run(acts.call_mcp_tool, CallMcpToolInput(
                server=SPEC, tool="big", arguments={"chars": chars}, session_id="bench-big",
                call_id=f"toolu_big_{size}"))
            wall = time.perf_counter() - started
            kept = await store.read("bench-big", f".keel/results/toolu_big_{size}.txt")
            out[f"{size}_mb"] = {
                "call_s": round(wall, 2), "is_error": result.is_error,
                "text_chars_returned": len(result.text),
                "kept_whole_bytes": len(kept.data) if kept else None,
                "note": result.text[-160:].strip() if result.truncated else ""}
        return out
    finally:
        if pool is not None:
            await pool.close()
        shutil.rmtree(folder, ignore_errors=True)


async def bench_writes(writes: int, sizes: tuple[int, ...] = (10, 50_000)) -> dict[str, Any]:
    import psycopg

    from activities.db import apply_migrations, close_pools
    from activities.workspace import PostgresStore
    from keel.devstack import temporary_postgres

    with temporary_postgres("keel-bench-ws-") as admin:
        name = f"bench_ws_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = admin.replace("/postgres?", f"/{name}?")
        apply_migrations(url)
        with psycopg.connect(url) as conn:
            for n in sizes:
                with conn.cursor().copy("COPY workspace_files (scope, path, version, data,"
                                        " size) FROM STDIN") as copy:
                    for i in range(n):
                        data = f"def f_{i}():\n    return {i}\n".encode()
                        copy.write_row((f"files-{n}", f"src/pkg{i % 100:03d}/m_{i:05d}.py",
                                        1, data, len(data)))
            conn.execute("ANALYZE workspace_files")
        store = PostgresStore(url, 10_000_000, 10_000_000_000)
        times: dict[int, list[float]] = {n: [] for n in sizes}
        try:
            for i in range(writes + 5):
                for n in sizes:  # alternately: drift weighs on both alike
                    started = time.perf_counter()
                    await store.write(f"files-{n}", f"notes/{i:05d}.md", b"a note\n" * 20,
                                      op_id=f"bench-{n}-{i}")
                    if i >= 5:
                        times[n].append(time.perf_counter() - started)
        finally:
            await close_pools()  # before the server stops under the pool
        return {f"write_in_{n}_files": summary(t) for n, t in times.items()}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20, help="cold calls (10 warm each)")
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--big", default="1,8,64", help="result sizes, million characters")
    parser.add_argument("--out", default="mcp")
    parser.add_argument("--commit", default="", help="the commit measured (an older tree)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    calls = await bench_calls(args.calls)
    big = await bench_big([int(s) for s in args.big.split(",") if s])
    writes = await bench_writes(args.writes)
    figures = {"mcp_calls": calls, "mcp_big_results": big, "workspace_writes": writes,
               "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
               "cpus": os.cpu_count(), "source_commit": args.commit or source_commit()}
    rows = [[k, v["median_ms"], v["p90_ms"]] for part in (calls, writes)
            for k, v in part.items() if isinstance(v, dict)]
    print(table("MCP calls and workspace writes (ms)", ["figure", "median", "p90"], rows))
    print(table("large MCP results over stdio", ["size", "call s", "returned", "kept"],
                [[k, v["call_s"], v["text_chars_returned"], v["kept_whole_bytes"]]
                 for k, v in big.items()]))
    out = Path(__file__).resolve().parent / "results" / f"{args.out}.json"
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(main())
