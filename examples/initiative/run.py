"""The agent's own initiative, runnable: `python -m examples.initiative.run` (offline by
default; with ANTHROPIC_API_KEY set, the real model). With no TEMPORAL_ADDRESS /
DATABASE_URL it starts the embedded dev stack under KEEL_DATA_DIR (default
.keel-example).

A release-watch service: its agent may schedule wakeups (at most three at once, none sooner
than a second, each gone after an hour) and delegate to a `checker` sub-agent. The person
asks it to look again in a few seconds; the agent asks the checker (its answer comes back
as an agent run input) and schedules a wakeup, which later fires as a Task in Keel's voice
and gets a turn of its own. The script prints each step and the record's source lines.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import psycopg

from keel.client import KeelClient, session_config
from keel.devstack import running_stack
from keel.record import read_record
from schemas.agent import AgentSpec
from schemas.config import KeelSettings
from schemas.initiative import SubAgent, WakeupLimits
from workers.worker import build_worker

ROOT = Path(__file__).resolve().parent.parent.parent
AGENT = AgentSpec(
    instructions="You watch a release. First ask the checker with delegate, then plan a "
                 "second look with schedule_wakeup.",
    wakeups=WakeupLimits(max_active=3, min_interval_s=1, expiry_s=3600),
    sub_agents=[SubAgent(name="checker", description="checks the release notes",
                         instructions="You check release notes and answer in one line.",
                         timeout_s=120)])
MESSAGE = "Is the release out yet? Look again in 3 seconds."


async def main() -> None:
    os.environ.setdefault("KEEL_DATA_DIR", str(ROOT / ".keel-example"))
    settings = KeelSettings.from_env()
    async with running_stack(settings) as stack:
        settings = settings.model_copy(update={"database_url": stack.database_url})
        async with build_worker(stack.client, settings):
            keel = KeelClient(stack.client, settings.task_queue, settings)
            session = await keel.start_session(
                f"release-{uuid.uuid4().hex[:6]}",
                config=session_config(settings, memory_scope=None, agent=AGENT))
            print(f"person: {MESSAGE}")
            outcome = await session.ask(MESSAGE)
            print(f"agent: {outcome.reply_text}")
            status = await session.status()
            for child in status.children:
                print(f"sub-agent {child.agent}: session {child.session_id}, {child.done}")
            for wakeup in await session.wakeups():
                print(f"wakeup {wakeup.id} due {wakeup.due}: {wakeup.note}")
            while await session.wakeups() or (await session.status()).phase != "idle":
                await asyncio.sleep(0.5)  # it fires, and its Task gets a turn
            print(f"after the wakeup: turn {(await session.status()).turn}")
            with psycopg.connect(settings.database_url or "") as conn:
                for row in read_record(conn, session.session_id):  # as `keel history`
                    if row.source_line:
                        print(f"  #{row.seq} {row.source_line} {row.text[:70]!r}")
            await session.end()


if __name__ == "__main__":
    asyncio.run(main())
