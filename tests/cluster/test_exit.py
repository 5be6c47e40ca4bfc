"""A process that made Temporal calls exits cleanly, however soon after its last call.

The Rust core finishes each call on a thread of its own; a script that ended right after its
last call could finalize the interpreter under that thread and die with SIGSEGV or SIGABRT
after its work was done (temporalio/sdk-python#300). `workers.connect.connect` makes every
such process pause at exit. Without it, 6 of 24 runs of this script, four at a time, died here.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from temporalio.client import Client

ROOT = Path(__file__).resolve().parents[2]
RUNS, AT_ONCE = 12, 4

SCRIPT = """
import asyncio, sys
from schemas.config import KeelSettings
from workers.connect import connect

async def main() -> None:
    client = await connect(KeelSettings(), sys.argv[1])
    counts = await asyncio.gather(*(client.count_workflows() for _ in range(50)))
    print(len(counts))  # the last calls end just before the interpreter does

asyncio.run(main())
"""


async def _run(address: str, gate: asyncio.Semaphore) -> tuple[int | None, str]:
    async with gate:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SCRIPT, address, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert out.strip() == b"50", err.decode()[-2000:]  # its work was done
        return proc.returncode, err.decode()[-600:]


async def test_a_script_ending_right_after_its_last_calls_exits_with_code_0(
        client: Client) -> None:
    address = client.service_client.config.target_host
    gate = asyncio.Semaphore(AT_ONCE)
    ends = await asyncio.gather(*(_run(address, gate) for _ in range(RUNS)))
    died = [(code, err) for code, err in ends if code != 0]
    assert not died, f"{len(died)} of {RUNS} runs died at exit: {died[:2]}"
