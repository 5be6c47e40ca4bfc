"""The commands that run things: `dev` (the whole stack and a worker), `worker`, `demo`, `ui`.

Invariants: what runs is built elsewhere (`keel.devstack`, `workers.worker`, `keel.demo`,
`keel.ui.server`); here it is started, announced and stopped, everything started stopped
in reverse order on Ctrl-C or SIGTERM. Only one `keel dev` runs on a data dir.
"""

from __future__ import annotations

import asyncio
import os
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from keel.cli.shell import (
    CliError,
    connect,
    database_url,
    install_stop_signals,
    load_settings,
    run,
)
from keel.client import KeelClient
from keel.console import console, error, key_values, redact_url, working
from keel.demo import DEFAULT_TURNS
from schemas.config import KeelSettings

if TYPE_CHECKING:  # the stack's code loads only when a command runs one
    from keel.devstack import Stack

__all__ = ["demo", "dev", "ui_command", "worker"]


def dev(ui: Annotated[bool, typer.Option(help="Start the Temporal Web UI too.")] = True,
        keel_ui: Annotated[bool, typer.Option(help="Serve Keel's own UI (`keel ui`) too.")]
        = True,
        ui_port: Annotated[int, typer.Option(min=0, max=65_535,
                                             help="Port of Keel's UI (on 127.0.0.1).")]
        = 8765,
        ) -> None:
    """Start the embedded stack (or use TEMPORAL_ADDRESS / DATABASE_URL) and a worker."""
    from workers.observability import configure_logging

    settings = load_settings()
    configure_logging(settings)
    _start_metrics(settings)
    run(_serve(settings, ui=ui, require_configured=False,
               keel_ui_port=ui_port if keel_ui else None))


def worker(vault: Annotated[bool, typer.Option(
        "--vault", help="Serve the vault's own queue (<queue>-vault): run exactly one, on "
                        "the host that holds the vault folder; a second one stands by.")]
           = False) -> None:
    """Run a worker against a configured cluster (TEMPORAL_ADDRESS and DATABASE_URL): the
    session queue, or with --vault the vault's queue."""
    from workers.observability import configure_logging

    settings = load_settings()
    missing = [name for name, value in (("TEMPORAL_ADDRESS", settings.temporal_address),
                                        ("DATABASE_URL", settings.database_url)) if not value]
    if missing:
        error(f"{' and '.join(missing)} not set: `keel worker` serves a configured "
              "cluster. For everything on this machine use `keel dev`.")
        raise typer.Exit(2)
    configure_logging(settings)
    _start_metrics(settings)
    run(_serve(settings, ui=False, require_configured=True,
               role="vault" if vault else "sessions"))


def _start_metrics(settings: KeelSettings) -> None:
    """The process's metrics, set up before its first Temporal client (workers.metrics)."""
    from workers.metrics import MetricsSettingsError, install_metrics

    try:
        install_metrics(settings)
    except MetricsSettingsError as err:
        error(str(err))
        raise typer.Exit(2) from None


async def _serve(settings: KeelSettings, *, ui: bool, require_configured: bool,
                 role: str = "both", keel_ui_port: int | None = None) -> None:
    """The stack (embedded, or the configured one), Keel's UI if asked, and a worker, until
    Ctrl-C or SIGTERM."""
    from activities.db import close_pools
    from keel.devstack import running_stack, wait_for_servers
    from workers.observability import shutdown_tracing

    stop = asyncio.Event()
    if settings.temporal_address or settings.database_url:
        # Configured servers may be starting beside this worker: it waits for them first,
        # while Ctrl-C and SIGTERM still end it as they do by default.
        with working("Waiting for Temporal and PostgreSQL to answer…"):
            await wait_for_servers(settings)
    install_stop_signals(stop)
    if not require_configured:
        await _refuse_second_dev(settings)
    async with AsyncExitStack() as stack_exit:
        # Unwound in reverse: pools closed, then the stack stopped, then tracing flushed.
        stack_exit.callback(shutdown_tracing)
        what = ("Connecting to Temporal and PostgreSQL…" if require_configured else
                "Starting the stack (embedded PostgreSQL, Temporal dev server)…")
        with working(what):
            stack = await stack_exit.enter_async_context(running_stack(settings, ui=ui))
        stack_exit.push_async_callback(close_pools)
        # The embedded PostgreSQL's URL is known only now; the activities need it.
        settings = settings.model_copy(update={"database_url": stack.database_url})
        ui_address = _dev_ui_address(stack, ui)
        keel_ui = None
        if keel_ui_port is not None:
            from keel.ui.server import ui_server

            keel_ui = await stack_exit.enter_async_context(ui_server(
                KeelClient(stack.client, settings.task_queue, settings), settings,
                stack.database_url, port=keel_ui_port, temporal_ui=ui_address))
        console.print(_banner(stack, settings, role=role, ui_address=ui_address,
                              keel_ui=keel_ui, require_configured=require_configured))
        await _run_worker(stack, settings, role, stop)
    console.print("[green]stopped[/]")


async def _refuse_second_dev(settings: KeelSettings) -> None:
    from keel.demo import running_dev_stack
    from keel.devstack import stop_orphaned_stack

    if not (settings.temporal_address or settings.database_url) and (
            stopped := stop_orphaned_stack(settings.data_dir)):
        console.print(f"[dim]a `keel dev` that was killed left its Temporal dev server "
                      f"running (pid {', '.join(map(str, stopped))}): stopped it[/]")

    if other := await running_dev_stack(settings):
        raise CliError(f"`keel dev` is already running in {settings.data_dir} (Temporal at "
                       f"{other['temporal_address']}); stop it first, or run `keel worker` "
                       "with TEMPORAL_ADDRESS and DATABASE_URL to add a worker to it")


def _banner(stack: Stack, settings: KeelSettings, *, role: str, ui_address: str | None,
            keel_ui: str | None, require_configured: bool) -> Table:
    """What runs where: the lines `keel dev` and `keel worker` start with."""
    from workers.metrics import metrics_where

    return key_values([
        ("Temporal", stack.temporal_address
         + (" (embedded dev server, SQLite file under the data dir)"
            if stack.embedded else "")),
        *([("Temporal UI", ui_address)] if ui_address else []),
        *([("Keel UI", keel_ui)] if keel_ui else []),
        ("PostgreSQL", redact_url(stack.database_url)),
        ("task queue", {"both": f"{settings.task_queue} and {settings.vault_task_queue}",
                        "vault": settings.vault_task_queue}.get(role, settings.task_queue)),
        ("workspaces", "PostgreSQL" if settings.workspace_store == "postgres"
         else str(settings.workspaces_dir)),
        ("namespace", settings.temporal_namespace),
        ("model", "offline deterministic model (no API key)" if settings.model.offline
         else settings.model.name),
        ("data dir", settings.data_dir),
        *([("metrics", metrics_where(settings))] if settings.metrics else []),
    ], title="keel " + ("worker" if require_configured else "dev")
               + (" (vault)" if role == "vault" else ""))


async def _run_worker(stack: Stack, settings: KeelSettings, role: str,
                      stop: asyncio.Event) -> None:
    from workers.observability import worker_interceptors
    from workers.schedules import keep_memory_schedules
    from workers.worker import Role, WorkerFailedError, build_worker, serve_until

    worker = build_worker(stack.client, settings,
                          interceptors=worker_interceptors(settings), role=Role(role))
    if role != "sessions":
        console.print(f"[dim]taking the vault lock for {settings.vault_task_queue} "
                      "(a second vault worker stands by here)…[/]")

    async def ready() -> None:
        console.print("[green]worker running[/] — Ctrl-C to stop")
        # The nightly rollups and the doctor, as Temporal Schedules (created or updated;
        # tried again while the server is away).
        await keep_memory_schedules(stack.client, settings)

    async def say_stopping() -> None:
        await stop.wait()
        console.print(f"stopping: the calls in flight may finish first (up to "
                      f"{settings.shutdown_grace_s:g} s; Ctrl-C again stops now)…")

    saying = asyncio.create_task(say_stopping())
    try:
        served = await serve_until(worker, stop, ready)
    except WorkerFailedError as err:  # one line, exit 1: its supervisor starts it again
        raise CliError(f"{err}; this worker has stopped") from None
    finally:
        saying.cancel()
    if served:
        console.print("stopping: worker…")
    console.print("stopping: " + ("connections…" if not stack.embedded else
                                  "Temporal dev server, PostgreSQL…"))


def _dev_ui_address(stack: Stack, ui: bool) -> str | None:
    # The dev server puts its UI on the gRPC port + 1000 unless told otherwise (it prints
    # the same in its banner); running_stack does not pass a UI port.
    if not (ui and stack.embedded):
        return None
    host, _, port = str(stack.temporal_address).rpartition(":")
    return f"http://{host}:{int(port) + 1000}" if port.isdecimal() else None


def demo(
    turns: Annotated[int, typer.Option(min=1, help="Most turns to play.")] = DEFAULT_TURNS,
    session: Annotated[str | None, typer.Option("--session", help="Session id.")] = None,
) -> None:
    """Keel's main job end to end: a 60-PR review queue on a small window, with checkpoints."""
    from keel.demo import run_demo
    from workers.observability import configure_logging

    settings = load_settings()
    # The demo's own lines tell the story; logs only for what went wrong.
    configure_logging(settings, level=os.environ.get("KEEL_LOG_LEVEL") or "WARNING")
    result = run(run_demo(settings, turns=turns, session_id=session))
    if not result.ok:
        raise typer.Exit(1)


def ui_command(
    host: Annotated[str, typer.Option(help="Address to bind; anything but loopback needs "
                                           "a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65_535, help="Port (0: any free one).")] = 8765,
    token: Annotated[str | None, typer.Option(
        envvar="KEEL_UI_TOKEN", help="Access token, required off loopback.")] = None,
    temporal_ui: Annotated[str | None, typer.Option(
        envvar="KEEL_TEMPORAL_UI", help="The Temporal Web UI's URL, for workflow links.")]
    = None,
) -> None:
    """Serve Keel's web UI (sessions, record, checkpoints, vault) and print its URL."""
    from keel.ui.security import UnsafeBindError, check_bind
    from keel.ui.server import ui_server

    try:
        check_bind(host, token)
    except UnsafeBindError as err:
        error(str(err))
        raise typer.Exit(1) from None

    async def main() -> None:
        settings = load_settings()
        keel = await connect(settings)
        stop = asyncio.Event()
        install_stop_signals(stop)
        async with ui_server(keel, settings, database_url(settings), host=host, port=port,
                             token=token, temporal_ui=temporal_ui) as url:
            console.print(f"Keel UI: [bold]{url}[/] — Ctrl-C to stop")
            await stop.wait()
    run(main())
