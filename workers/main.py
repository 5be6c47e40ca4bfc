"""`python -m workers.main [sessions|vault|both]`: one worker process, configured from the
environment (the same as `keel worker [--vault]`, without the console).

`sessions` (the default) serves the session queue; `vault` the vault's own queue (one such
process owns the vault; a second stands by); `both` serves the two, as `keel dev` does.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import psycopg

from activities.db import apply_migrations, wait_for_database
from schemas.config import KeelSettings
from workers.connect import NoNamespaceError, connect_when_up
from workers.metrics import MetricsSettingsError, install_metrics
from workers.observability import configure_logging, shutdown_tracing, worker_interceptors
from workers.schedules import keep_memory_schedules
from workers.worker import Role, WorkerFailedError, build_worker, serve_until


async def main(role: Role = Role.SESSIONS) -> None:
    try:
        settings = KeelSettings.from_env()
    except ValueError as err:  # a setting to fix, named: one line, as `keel worker` says it
        raise SystemExit(f"a setting is wrong: {err}") from None
    configure_logging(settings)
    try:
        install_metrics(settings)  # before the first client: its runtime exports them
    except MetricsSettingsError as err:
        raise SystemExit(str(err)) from None
    if not settings.temporal_address or not settings.database_url:
        raise SystemExit("a worker needs TEMPORAL_ADDRESS and DATABASE_URL")
    # Both servers may be starting beside this worker: it waits for them (connect_wait_s).
    try:
        wait_for_database(settings.database_url, settings.connect_wait_s)
    except psycopg.ProgrammingError as err:  # no connection string: a setting to fix
        raise SystemExit(f"a setting is wrong: {err}") from None
    apply_migrations(settings.database_url)
    try:
        client = await connect_when_up(settings)
    except NoNamespaceError as err:  # one line, not a traceback: a setting to fix
        raise SystemExit(str(err)) from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    workers = build_worker(client, settings, interceptors=worker_interceptors(settings),
                           role=role)

    async def ready() -> None:
        await keep_memory_schedules(client, settings)

    try:
        await serve_until(workers, stop, ready)
    except WorkerFailedError as err:  # exit 1: whatever supervises it starts it again
        raise SystemExit(f"{err}; this worker has stopped") from None
    finally:
        shutdown_tracing()


if __name__ == "__main__":
    asyncio.run(main(Role(sys.argv[1]) if len(sys.argv) > 1 else Role.SESSIONS))
