"""`python -m workers.main`: one worker process, configured from the environment."""

from __future__ import annotations

import asyncio
import signal

from activities.db import apply_migrations
from keel.connect import connect
from schemas.config import KeelSettings
from workers.observability import configure_logging, shutdown_tracing, worker_interceptors
from workers.schedules import ensure_memory_schedules
from workers.worker import build_worker


async def main() -> None:
    settings = KeelSettings.from_env()
    configure_logging(settings)
    if not settings.temporal_address or not settings.database_url:
        raise SystemExit("a worker needs TEMPORAL_ADDRESS and DATABASE_URL")
    apply_migrations(settings.database_url)
    client = await connect(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with build_worker(client, settings, interceptors=worker_interceptors(settings)):
        await ensure_memory_schedules(client, settings)
        await stop.wait()
    shutdown_tracing()


if __name__ == "__main__":
    asyncio.run(main())
