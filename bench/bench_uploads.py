"""Files through the client: what a put and a read of a file cost, and what they leave in
the session's history.

A service hands a session a file with `SessionHandle.put_file` and reads one back with
`read_file`. A file of up to one part (360 KiB) goes in one Update of the session, a larger
one in parts through an upload (a download) workflow of its own (schemas.uploads).
On the embedded stack (Temporal dev server, embedded PostgreSQL, the local store), this
puts and reads incompressible files of each size `--repeat` times and prints the median
seconds of each, the throughput, and the bytes the session's history grew by per put and
read (its events' JSON), against the file's own size.

    .venv/bin/python bench/bench_uploads.py                   # 0.5, 2.7 and 9.5 MB
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from activities.db import close_pools  # noqa: E402
from bench.common import table, write_results  # noqa: E402
from bench.memory_drive import stop_embedded_postgres  # noqa: E402
from keel.client import KeelClient, SessionHandle  # noqa: E402
from keel.devstack import running_stack  # noqa: E402
from schemas.config import KeelSettings  # noqa: E402
from schemas.uploads import UPLOAD_PART_BYTES  # noqa: E402
from workers.worker import build_worker  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "uploads.json"
SIZES = "500000,2700000,9500000"


async def history_bytes(session: SessionHandle) -> int:
    return len((await session.handle.fetch_history()).to_json())


async def one_size(session: SessionHandle, size: int, repeat: int) -> dict[str, Any]:
    puts, reads, grew_put, grew_read = [], [], [], []
    for i in range(repeat):
        data = os.urandom(size)
        before = await history_bytes(session)
        t0 = time.perf_counter()
        await session.put_file(f"bench/{size}-{i}.bin", data)
        puts.append(time.perf_counter() - t0)
        middle = await history_bytes(session)
        t0 = time.perf_counter()
        back = await session.read_file(f"bench/{size}-{i}.bin")
        reads.append(time.perf_counter() - t0)
        assert back is not None and back.data == data
        grew_put.append(middle - before)
        grew_read.append(await history_bytes(session) - middle)
    put_s, read_s = statistics.median(puts), statistics.median(reads)
    return {"bytes": size, "parts": -(-size // UPLOAD_PART_BYTES),
            "put_s": round(put_s, 3), "read_s": round(read_s, 3),
            "put_mb_s": round(size / put_s / 1e6, 1), "read_mb_s": round(size / read_s / 1e6, 1),
            "history_bytes_per_put": int(statistics.median(grew_put)),
            "history_bytes_per_read": int(statistics.median(grew_read))}


async def run(sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="keel-uploads-bench-"))
    settings = KeelSettings(data_dir=tmp, task_queue=f"bench-{uuid.uuid4().hex[:8]}",
                            max_file_bytes=max(sizes) + 1)
    try:
        async with running_stack(settings) as stack:
            settings = settings.model_copy(update={"database_url": stack.database_url})
            async with build_worker(stack.client, settings):
                keel = KeelClient(stack.client, settings.task_queue, settings)
                session = await keel.start_session(f"uploads-{uuid.uuid4().hex[:6]}")
                rows = [await one_size(session, size, repeat) for size in sizes]
                await session.end()
    finally:
        await close_pools()
        stop_embedded_postgres(tmp)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default=SIZES, help="file sizes in bytes, comma-separated")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    started = time.time()
    rows = asyncio.run(run([int(s) for s in args.sizes.split(",")], args.repeat))
    print(table("files through the client (median of each)",
                ["bytes", "parts", "put s", "read s", "put MB/s", "read MB/s",
                 "history +B / put", "history +B / read"],
                [[f"{r['bytes']:,}", r["parts"], r["put_s"], r["read_s"], r["put_mb_s"],
                  r["read_mb_s"], f"{r['history_bytes_per_put']:,}",
                  f"{r['history_bytes_per_read']:,}"] for r in rows]))
    write_results(RESULTS, "uploads", started, repeat=args.repeat, sizes=rows)


if __name__ == "__main__":
    main()
