"""The support story, runnable: `python -m examples.support.run` (offline by default; with
ANTHROPIC_API_KEY set, the real model). With no TEMPORAL_ADDRESS / DATABASE_URL it starts
the embedded dev stack under KEEL_DATA_DIR (default .keel-example).

It starts a Keel worker, the service's own worker (a second process, its own task queue),
a session with agent.toml (instructions, lookup_order, refund needing approval, the docs MCP
server over stdio), sends the customer's message, takes a checkpoint while the refund waits,
approves it with `keel approve` like a person would, and prints the reply.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

from keel.client import KeelClient
from keel.devstack import running_stack
from schemas.agent import spec_from_text
from schemas.config import KeelSettings
from workers.worker import build_worker

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MESSAGE = "Order A-1001 arrived broken. Please refund it."


async def main() -> None:
    os.environ.setdefault("KEEL_DATA_DIR", str(ROOT / ".keel-example"))
    settings = KeelSettings.from_env()
    spec = spec_from_text((HERE / "agent.toml").read_text(), ".toml")
    docs = spec.mcp_servers[0].stdio
    assert docs is not None  # agent.toml runs the docs server over stdio
    docs.command = sys.executable
    async with running_stack(settings) as stack:
        settings = settings.model_copy(update={"database_url": stack.database_url})
        env = {**os.environ, "TEMPORAL_ADDRESS": stack.temporal_address,
               "KEEL_TASK_QUEUE": settings.task_queue,
               "REFUND_LOG": str(settings.data_dir / "refunds.jsonl")}
        service = subprocess.Popen([sys.executable, "-m", "examples.support.service",
                                    "--address", stack.temporal_address], cwd=ROOT, env=env)
        try:
            async with build_worker(stack.client, settings):
                keel = KeelClient(stack.client, settings.task_queue, settings)
                session_id = f"support-{uuid.uuid4().hex[:6]}"
                session = await keel.start_session(session_id, agent=spec)
                print(f"started {session_id} (model: "
                      f"{'offline' if settings.model.offline else settings.model.name})")
                print(f"customer: {MESSAGE}")
                accepted = await session.send(MESSAGE)
                while not (pending := await session.pending()):
                    await asyncio.sleep(0.2)
                for p in pending:
                    print(f"waiting on approval: {p.tool} {p.input} (call {p.call_id})")
                status = await session.checkpoint_now()
                print(f"checkpoint taken while waiting: {status.checkpoint_count} so far, "
                      f"phase {status.phase.value}")
                cmd = ["keel", "approve", session_id, pending[0].call_id, "--by", "support-lead"]
                print("$ " + " ".join(cmd))
                out = await asyncio.to_thread(subprocess.run, [
                    sys.executable, "-m", "keel.cli", *cmd[1:]], env=env, cwd=ROOT,
                    capture_output=True, text=True)
                print(out.stdout.strip() or out.stderr.strip())
                outcome = await session.wait_reply(accepted.seq)
                print(f"agent: {outcome.reply_text}")
                final = await session.end()
                print(f"ended {session_id}: turn {final.turn}, "
                      f"{final.checkpoint_count} checkpoint(s)")
        finally:
            service.terminate()
            service.wait(10)


if __name__ == "__main__":
    asyncio.run(main())
