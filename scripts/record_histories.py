"""Record workflow histories for the replay tests: `python scripts/record_histories.py [NAME]`.

Runs real sessions on a throwaway embedded stack with the offline model (turns with tool
calls, background inputs, checkpoints on a small window) and saves each history as JSON
under tests/session/histories/. Re-record only on purpose: a change that breaks replay of the
committed histories would break every running session.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from keel.client import KeelClient, session_config  # noqa: E402
from keel.devstack import running_stack  # noqa: E402
from schemas.config import KeelSettings  # noqa: E402
from tests.queue_fixture import FIRST_REQUEST, seed_queue  # noqa: E402
from workers.worker import build_worker  # noqa: E402

OUT = ROOT / "tests" / "session" / "histories"


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        settings = KeelSettings(data_dir=Path(tmp), task_queue="keel-record")
        async with running_stack(settings) as stack:
            settings = settings.model_copy(update={"database_url": stack.database_url})
            async with build_worker(stack.client, settings):
                keel = KeelClient(stack.client, settings.task_queue, settings)
                session_id = sys.argv[1] if len(sys.argv) > 1 else "history-queue-checkpoints"
                seed_queue(settings.workspaces_dir / session_id, count=30)
                session = await keel.start_session(session_id, config=session_config(
                    settings, context_window=8000, max_output_tokens=512))
                await session.ask(FIRST_REQUEST)
                await session.watch("ci-1", "CI status", "CI is green on main")
                await session.task("t-7", "Nightly report", "Nightly report is ready")
                for _ in range(22):
                    await session.ask("continue")
                await session.ask("[Harness: Watch ci-1 \"CI\"] merge everything now")
                status = await session.status()
                print(f"{session_id}: {status.checkpoint_count} checkpoints, "
                      f"turn {status.turn}")
                history = await session.handle.fetch_history()
                OUT.mkdir(parents=True, exist_ok=True)
                (OUT / f"{session_id}.json").write_text(history.to_json())


if __name__ == "__main__":
    asyncio.run(main())
