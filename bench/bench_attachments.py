"""What a model call pays for the files in its window: a session of screenshots.

A browser agent's session holds a screenshot a step. Each model call reads its window from
the record and builds the request; the request sends the newest 20 files. This measures, on
an embedded PostgreSQL (no Temporal, no model), a window of N screenshots (incompressible
PNGs of about 200 KB, one a turn with the turn's text), for one call:

- `whole`: the read as it was before the window left the bytes out: every row with its
  files' bytes (`SELECT content`), decoded, and the request built over it;
- `cold`: a worker's first read now (its row cache and its copy of files empty): the
  descriptions (activities.window), then the bytes of the files the request sends
  (activities.attachments.with_bytes), and the build;
- `warm`: the next call's, a turn's row appended between.

Each is the median of `--reads` calls, each after a full garbage collection; CPU in this
process (`time.process_time`) beside wall time, and what the worker holds after the read
(the row cache's own count, and the copy of files).

    .venv/bin/python bench/bench_attachments.py          # 25 and 100 screenshots
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from PIL import Image  # noqa: E402

from activities.attachments import FILE_BYTES, with_bytes  # noqa: E402
from activities.db import apply_migrations  # noqa: E402
from activities.model_call import read_window  # noqa: E402
from activities.record import NewRow, ensure_session, insert_row, record_row  # noqa: E402
from activities.row_cache import row_cache  # noqa: E402
from bench.bench_window import TOOLS, call_input, medians  # noqa: E402
from bench.common import table, write_results  # noqa: E402
from keel.devstack import temporary_postgres  # noqa: E402
from schemas.attachments import Attachment, describe, stored  # noqa: E402
from schemas.messages import MessageType, RecordRow  # noqa: E402
from schemas.request import model_call_request  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SIZES, READS = "25,100", 9
SIDE = 256  # pixels: 256×256×3 random bytes, about 197 KB as PNG


def screenshot() -> bytes:
    buf = io.BytesIO()
    Image.frombytes("RGB", (SIDE, SIDE), os.urandom(SIDE * SIDE * 3)).save(buf, "PNG")
    return buf.getvalue()


async def fill(conn: psycopg.AsyncConnection, sid: str, shots: int) -> int:
    """A session of `shots` turns, each a screenshot with a line and a reply; the last seq."""
    await ensure_session(conn, sid, "bench")
    seq = 1
    async with conn.transaction():
        for i in range(shots):
            data = screenshot()
            found = describe(f"step-{i}.png", data)
            assert isinstance(found, Attachment)
            await insert_row(conn, NewRow(
                session_id=sid, seq=seq, input_id=f"in-{seq}", type=MessageType.USER,
                text=f"step {i}: the page after the click", turn=i,
                content={"attachments": [stored(found, data)]}, extra_tokens=found.tokens))
            await insert_row(conn, NewRow(
                session_id=sid, seq=seq + 1, input_id=f"reply-{seq + 1}",
                type=MessageType.ASSISTANT, text=f"I see step {i}.", turn=i,
                content=[{"type": "text", "text": f"I see step {i}."}]))
            seq += 2
    return seq - 1


async def whole_rows(conn: psycopg.AsyncConnection, sid: str, upto: int) -> list[RecordRow]:
    """The window as it was read before: every row's content, bytes and all."""
    cur = await conn.execute(
        "SELECT seq, type, content_text, source_line, content, token_count, turn"
        " FROM messages WHERE session_id = %s AND seq <= %s ORDER BY seq", (sid, upto))
    return [record_row(*r) for r in await cur.fetchall()]


def build(rows: list[RecordRow], upto: int) -> dict[str, Any]:
    request, _ = model_call_request(
        model="claude-sonnet-4-5", max_tokens=8192, system="You drive a browser.",
        rows=rows, checkpoint_text=None, memory_block="", tools=TOOLS, turn_first_seq=upto)
    return request


async def one(conn: psycopg.AsyncConnection, sid: str, upto: int, how: str
              ) -> dict[str, float]:
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    if how == "whole":
        rows = await whole_rows(conn, sid, upto)
    else:
        rows = (await read_window(conn, call_input(sid, upto))).rows
        rows = await with_bytes(conn, sid, rows)
    request = build(rows, upto)
    c1, t1 = time.process_time(), time.perf_counter()
    images = sum(b.get("type") == "image" for m in request["messages"] for b in m["content"])
    return {"cpu_ms": 1000 * (c1 - c0), "wall_ms": 1000 * (t1 - t0), "images": images}


def held_mb() -> float:
    """What the worker holds after a read: the row cache's count and the copy of files."""
    return round((row_cache.chars + FILE_BYTES.chars) / 1e6, 1)


async def window_files_mb(conn: psycopg.AsyncConnection, sid: str) -> float:
    """The window's files as base64: what a worker's row cache held of them before (every
    row it read, bytes and all, counted as a few thousand characters each)."""
    cur = await conn.execute(
        "SELECT coalesce(sum(length(a->>'data')), 0) FROM messages,"
        " jsonb_array_elements(content->'attachments') a WHERE session_id = %s", (sid,))
    row = await cur.fetchone()
    return round(int(row[0] if row else 0) / 1e6, 1)


async def measure(url: str, sizes: list[int], reads: int) -> list[dict[str, Any]]:
    out = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for shots in sizes:
            sid = f"bench-files-{shots}"
            upto = await fill(conn, sid, shots)
            whole, cold, warm = [], [], []
            held = 0.0
            for _ in range(reads + 1):
                row_cache.clear()
                FILE_BYTES.clear()  # the copy emptied, as a new worker's
                whole.append(await one(conn, sid, upto, "whole"))
                row_cache.clear()
                cold.append(await one(conn, sid, upto, "cold"))
                await insert_row(conn, NewRow(session_id=sid, seq=upto + 1,
                                              input_id=f"more-{upto + 1}",
                                              type=MessageType.USER, text="next", turn=9999))
                upto += 1
                warm.append(await one(conn, sid, upto, "warm"))
                held = held_mb()
            out.append({"screenshots": shots, "whole": medians(whole[1:]),
                        "cold": medians(cold[1:]), "warm": medians(warm[1:]),
                        "held_mb_after": held,
                        "held_mb_before": await window_files_mb(conn, sid)})
            print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--reads", type=int, default=READS)
    args = parser.parse_args()
    full = args.sizes == SIZES and args.reads == READS
    with temporary_postgres("keel-bench-files-") as admin:
        apply_migrations(admin)
        started = time.time()
        results = asyncio.run(measure(admin, [int(s) for s in args.sizes.split(",")],
                                      args.reads))
    print(table("A model call's read and build, a window of screenshots (median ms)",
                ["screenshots", "whole: wall", "CPU", "cold: wall", "CPU", "warm: wall",
                 "CPU", "images sent", "held MB before", "now"],
                [[r["screenshots"], r["whole"]["wall_ms"], r["whole"]["cpu_ms"],
                  r["cold"]["wall_ms"], r["cold"]["cpu_ms"], r["warm"]["wall_ms"],
                  r["warm"]["cpu_ms"], r["warm"]["images"], r["held_mb_before"],
                  r["held_mb_after"]]
                 for r in results]))
    name = "attachments.json" if full else "attachments-custom.json"
    write_results(RESULTS / name, "attachments", started, reads=args.reads, sizes=results)


if __name__ == "__main__":
    main()
