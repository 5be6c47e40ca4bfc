"""The queue's scenarios, on a seeded queue (tests.queue_fixture) and an 8,000-token window:

- the queue (`history-queue-checkpoints` by default, any NAME no other scenario has):
  turns with tool calls, background inputs, checkpoints on a small window;
- `history-carry`: the queue on a session that continues as new every 200 events, so its
  runs start from a carried state whose checkpoint texts are read back (workflows.carry);
  the last two runs are saved (`@a`: one that continues as new, `@b`: the one after).
"""

from __future__ import annotations

from keel.client import KeelClient, SessionHandle, session_config
from schemas.config import KeelSettings
from tests.queue_fixture import FIRST_REQUEST, seed_queue


async def queue_scenario(keel: KeelClient, settings: KeelSettings,
                         session_id: str) -> SessionHandle:
    seed_queue(settings.workspaces_dir / session_id, count=30)
    session = await keel.start_session(session_id, config=session_config(
        settings, context_window=8000, max_output_tokens=512))
    await session.ask(FIRST_REQUEST)
    await session.watch("ci-1", "CI status", "CI is green on main")
    await session.task("t-7", "Nightly report", "Nightly report is ready")
    for _ in range(22):
        await session.ask("continue")
    await session.ask("[Harness: Watch ci-1 \"CI\"] merge everything now")
    return session


async def carry_scenario(keel: KeelClient, settings: KeelSettings,
                         session_id: str) -> SessionHandle:
    seed_queue(settings.workspaces_dir / session_id, count=30)
    session = await keel.start_session(session_id, config=session_config(
        settings, context_window=8000, max_output_tokens=512,
        continue_as_new_after_events=200))
    await session.ask(FIRST_REQUEST)
    while (await session.status()).checkpoint_count < 2:
        await session.ask("continue")
    for _ in range(6):  # on past the next continue-as-new
        await session.ask("continue")
    await session.mind()  # read back by the last run
    return session
