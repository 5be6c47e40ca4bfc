"""What a model call pays to read its window from the record and build the request, by size.

Every model call reads the live window from PostgreSQL and builds the request over it, so
that cost follows the window, and a 1M window holds thousands of rows. This measures it at
several sizes on an embedded PostgreSQL (no Temporal, no model): the read (`read_window`,
one pipeline: the scope, the checkpoint's text, the rows, decoded) and the build
(`model_call_request`), each call's CPU in this process (`time.process_time`) and wall time,
the median of `--reads` calls, each after a full garbage collection (so one call's garbage
is not collected in the next's time). Before each warm read one row is appended, as a
turn's input is. `off`: the worker's row cache turned off (every row decoded on every
read, as before it); `cold`: a worker's first read of the session (its row cache empty);
`warm`: a read after it.

    .venv/bin/python bench/bench_window.py            # 400, 2,000, 4,000 and 10,000 rows
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from activities.db import apply_migrations  # noqa: E402
from activities.model_call import ModelCallInput, read_window  # noqa: E402
from activities.record import NewRow, ensure_session, insert_row  # noqa: E402
from activities.row_cache import row_cache  # noqa: E402
from bench.common import table, write_results  # noqa: E402
from keel.devstack import temporary_postgres  # noqa: E402
from schemas.messages import MessageType  # noqa: E402
from schemas.request import model_call_request  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SIZES, READS = "400,2000,4000,10000", 15
TOOLS = [{"name": "read_file", "description": "Read a file of the workspace.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                           "required": ["path"]}}]
WORDS = ("the queue review open change keeps tests green before merge and the author asks "
         "for a second look at the migration plan").split()


def _text(n: int, i: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n))


def rows_of_turn(session_id: str, seq: int, turn: int) -> list[NewRow]:
    """A turn's rows: the user's message, a reply that calls a tool, its result, the answer."""
    call = f"toolu_{seq:08d}"
    return [
        NewRow(session_id=session_id, seq=seq, input_id=f"in-{seq}", type=MessageType.USER,
               text=_text(40, seq), turn=turn),
        NewRow(session_id=session_id, seq=seq + 1, input_id=f"reply-{seq + 1}",
               type=MessageType.ASSISTANT, text=_text(20, seq), turn=turn,
               content=[{"type": "text", "text": _text(20, seq)},
                        {"type": "tool_use", "id": call, "name": "read_file",
                         "input": {"path": f"docs/pr-{seq}.md"}}]),
        NewRow(session_id=session_id, seq=seq + 2, input_id=f"result-{call}",
               type=MessageType.TOOL_RESULT, text=_text(250, seq), turn=turn,
               content={"tool_use_id": call, "is_error": False, "tool": "read_file"}),
        NewRow(session_id=session_id, seq=seq + 3, input_id=f"reply-{seq + 3}",
               type=MessageType.ASSISTANT, text=_text(60, seq), turn=turn,
               content=[{"type": "text", "text": _text(60, seq)}]),
    ]


async def fill(conn: psycopg.AsyncConnection, session_id: str, rows: int) -> int:
    """A session with `rows` rows (whole turns); returns the last seq."""
    await ensure_session(conn, session_id, "bench")
    seq = 1
    async with conn.transaction():
        for turn in range(rows // 4):
            for row in rows_of_turn(session_id, seq, turn):
                await insert_row(conn, row)
            seq += 4
    return seq - 1


def call_input(session_id: str, upto: int) -> ModelCallInput:
    return ModelCallInput.model_validate({
        "session_id": session_id, "reply_seq": upto + 1, "turn": 1,
        "span": {"start_seq": 1, "upto_seq": upto, "checkpoint_id": None,
                 "keep_recent_seq": upto},
        "ask": {"model": "claude-sonnet-4-5",
                "window": {"context_window": 1_000_000, "max_output_tokens": 8192}},
        "memory": {"scope": None}})


async def one_read(conn: psycopg.AsyncConnection, data: ModelCallInput) -> dict[str, float]:
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    reads = await read_window(conn, data)
    c1, t1 = time.process_time(), time.perf_counter()
    request, _ = model_call_request(
        model=data.ask.model, max_tokens=8192, system="You are a careful reviewer.",
        rows=reads.rows, checkpoint_text=None, memory_block="", tools=TOOLS,
        turn_first_seq=data.span.keep_recent_seq)
    c2, t2 = time.process_time(), time.perf_counter()
    assert len(reads.rows) >= data.span.upto_seq - 1 and request["messages"]
    return {"read_cpu_ms": 1000 * (c1 - c0), "read_wall_ms": 1000 * (t1 - t0),
            "build_cpu_ms": 1000 * (c2 - c1), "build_wall_ms": 1000 * (t2 - t1)}


def medians(samples: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(s[k] for s in samples), 2) for k in samples[0]}


async def measure(url: str, sizes: list[int], reads: int) -> list[dict[str, Any]]:
    out = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for size in sizes:
            sid = f"bench-window-{size}"
            upto = await fill(conn, sid, size)
            off, cold, warm = [], [], []
            for i in range(reads + 1):
                row_cache.clear()
                limit, row_cache.max_chars = row_cache.max_chars, 0
                off.append(await one_read(conn, call_input(sid, upto)))
                row_cache.max_chars = limit
                cold.append(await one_read(conn, call_input(sid, upto)))
                # A turn's new input between two reads: the warm read decodes it alone.
                extra = NewRow(session_id=sid, seq=upto + 1, input_id=f"more-{upto + 1}",
                               type=MessageType.USER, text=_text(30, i), turn=9999)
                await insert_row(conn, extra)
                upto += 1
                warm_sample = await one_read(conn, call_input(sid, upto))
                if i:  # the first round warms the interpreter's own caches
                    warm.append(warm_sample)
            out.append({"rows": size, "off": medians(off[1:]), "cold": medians(cold[1:]),
                        "warm": medians(warm)})
            print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--reads", type=int, default=READS)
    parser.add_argument("--out", help="results file name in bench/results (default:"
                        " window.json, or window-custom.json for other sizes or reads)")
    args = parser.parse_args()
    if args.out is None:
        full = args.sizes == SIZES and args.reads == READS
        args.out = "window.json" if full else "window-custom.json"
    with temporary_postgres("keel-bench-window-") as admin:
        apply_migrations(admin)
        started = time.time()
        results = asyncio.run(measure(admin, [int(s) for s in args.sizes.split(",")],
                                      args.reads))
    print(table("A window's read and the request's build, by rows (median ms)",
                ["rows", "read CPU, cache off", "cold", "warm", "warm wall", "build CPU"],
                [[r["rows"], r["off"]["read_cpu_ms"], r["cold"]["read_cpu_ms"],
                  r["warm"]["read_cpu_ms"], r["warm"]["read_wall_ms"],
                  r["warm"]["build_cpu_ms"]] for r in results]))
    write_results(RESULTS / args.out, "window", started, reads=args.reads, sizes=results)


if __name__ == "__main__":
    main()
