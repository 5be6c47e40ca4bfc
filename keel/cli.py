"""The `keel` command line: run the stack and a worker, drive and inspect sessions.

Thin on purpose: every command calls `keel.client`, `keel.devstack` or `keel.demo`; no
session logic lives here. Commands other than `dev`, `worker` and `demo` find Temporal
through TEMPORAL_ADDRESS or the stack file `keel dev` writes under KEEL_DATA_DIR.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack, suppress
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import psycopg
import typer
from rich.markup import escape
from rich.prompt import Prompt
from rich.table import Table
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import WorkflowHistory, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Replayer

from keel.client import (
    KeelClient,
    KeelError,
    MessageRejectedError,
    SessionExistsError,
    SessionHandle,
)
from keel.console import console, error, key_values, one_line, redact_url, working
from keel.demo import DEFAULT_TURNS
from keel.live import LiveView, event_dict
from keel.record import RecordEntry, read_record
from schemas.agent import AgentSpec, spec_from_text
from schemas.config import KeelSettings
from schemas.session import SessionStatus, TurnOutcome


class _KeelApp(typer.Typer):
    """The console-script entry point (`keel = "keel.cli:app"`), ending the process itself.

    Temporal's Rust core keeps threads that may call back into Python while the
    interpreter finalizes, which aborts the process ("PyGILState_Release: thread state
    must be current", temporalio/sdk-python#300) after the command has already succeeded.
    So once the command is done: flush, run the atexit handlers (they stop the embedded
    PostgreSQL), and leave with os._exit, skipping only the finalization that crashes.
    Tests drive the command through CliRunner, which does not come through here.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        code: int = 0
        try:
            super().__call__(*args, **kwargs)
        except SystemExit as done:
            if isinstance(done.code, int):
                code = done.code
            elif done.code is not None:
                print(done.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            code = 130
        except BaseException:
            traceback.print_exc()
            code = 1
        for stream in (sys.stdout, sys.stderr):
            with suppress(Exception):
                stream.flush()
        atexit._run_exitfuncs()
        os._exit(code)


app = _KeelApp(
    name="keel",
    help="Keel: long AI agent sessions that do not forget (Temporal + PostgreSQL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

T = TypeVar("T")


class CliError(Exception):
    """A failure to report in one line (no traceback) with exit code 1."""


# How Temporal's server and SDK render a failure's metadata inside a message: noise to a
# person, and "retryable: true" on a refusal would say the opposite of what it means.
_FAILURE_METADATA = re.compile(r"\s*\((?:type: [^()]*, )?retryable: (?:true|false)\)")


def _refusal_line(err: BaseException) -> str:
    """A refusal as one readable line, without the failure's type / retryable metadata."""
    return one_line(_FAILURE_METADATA.sub("", str(err)), width=10_000)


def _run(main: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine. Every ordinary failure ends here as one line saying what
    to do (`failure_line`) and exit 1; Ctrl-C as one line and exit 130. Never a traceback:
    set KEEL_TRACEBACK=1 to see one."""
    try:
        return asyncio.run(main)
    except KeyboardInterrupt:
        error(INTERRUPTED)
        raise typer.Exit(130) from None
    except typer.Exit:
        raise
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        # What Ctrl-C becomes inside a waiting update call: asyncio cancels the command,
        # the SDK turns the cancel into this error, and asyncio.run raises that instead.
        error(INTERRUPTED)
        raise typer.Exit(130) from None
    except Exception as err:
        line = failure_line(err)
        if line is None or os.environ.get("KEEL_TRACEBACK"):
            raise
        error(line)
    raise typer.Exit(1)


INTERRUPTED = ("interrupted (Ctrl-C); sessions keep running in Temporal: "
               "`keel status SESSION` shows one")


def failure_line(err: BaseException) -> str | None:
    """The one line for an ordinary failure, by its type; None for a bug (a traceback)."""
    if isinstance(err, CliError | KeelError):  # KeelError: a refusal by type (keel._errors)
        return _refusal_line(err)
    if isinstance(err, RPCError):
        if err.status == RPCStatusCode.NOT_FOUND:
            return f"not found: {err.message} (is the session id right?)"
        if err.status == RPCStatusCode.UNAVAILABLE:
            return (f"Temporal is unreachable ({err.message}): check TEMPORAL_ADDRESS, or "
                    "start the stack with `keel dev`")
        return (f"Temporal answered {err.status.name if err.status else 'an error'}: "
                f"{err.message}")
    if isinstance(err, psycopg.OperationalError):
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return (f"PostgreSQL is unreachable ({first}): check DATABASE_URL, or start the "
                "stack with `keel dev`")
    if isinstance(err, psycopg.Error):
        return f"PostgreSQL: {one_line(str(err), 300)}"
    if isinstance(err, RuntimeError) and "connect" in str(err).lower():
        # Client.connect: "Failed client connect: Server connection error: tonic::...
        # message: \"Connection refused\" ...": the OS's message is the useful part.
        text = f"{err} {err.__cause__ or ''}"
        why = re.search(r'message: "([^"]+)"', text)
        return (f"Temporal is unreachable ({why.group(1).lower() if why else one_line(text, 160)})"
                ": check TEMPORAL_ADDRESS, or start the stack with `keel dev`")
    if isinstance(err, OSError) and err.errno is not None:
        return f"{err.strerror or err}: {err.filename or ''}".rstrip(": ")
    if isinstance(err, asyncio.CancelledError):
        return "cancelled"
    return None


def _settings() -> KeelSettings:
    return KeelSettings.from_env()


def _temporal_address(settings: KeelSettings) -> str:
    """TEMPORAL_ADDRESS, else the dev stack `keel dev` runs under KEEL_DATA_DIR."""
    if settings.temporal_address:
        return settings.temporal_address
    from keel.devstack import read_stack_file

    stack = read_stack_file(settings.data_dir)
    if stack and stack.get("temporal_address"):
        return stack["temporal_address"]
    raise CliError("no Temporal to talk to: set TEMPORAL_ADDRESS, or run `keel dev` first")


async def _connect(settings: KeelSettings) -> KeelClient:
    address = _temporal_address(settings)
    with working("Connecting to Temporal…"):
        return await KeelClient.connect(settings, address)


async def _session(session_id: str) -> SessionHandle:
    return (await _connect(_settings())).session(session_id)


def _status_table(status: SessionStatus) -> Table:
    pct = 100 * status.context_tokens / max(1, status.context_window)
    return key_values([
        ("session", status.session_id),
        ("phase", status.phase.value),
        ("turn", status.turn),
        ("context", f"{status.context_tokens:,} / {status.context_window:,} tokens "
                    f"({pct:.0f}%), checkpoint at {status.checkpoint_threshold:,}"),
        ("checkpoints", status.checkpoint_count),
        ("pending inputs", status.pending_inputs),
        ("window starts at", f"#{status.window_start_seq}"),
        ("last seq", status.last_seq),
        ("model", status.model),
        *([("stopped", status.stopped_reason)] if status.stopped_reason else []),
        *[("awaiting approval", f"{p.tool} (call {p.call_id}) since "
                                f"{p.since.isoformat(timespec='seconds')}")
          for p in status.pending_approvals],
        *([("last error", status.last_error)] if status.last_error else []),
    ])


def _install_stop_signals(stop: asyncio.Event) -> None:
    """Ctrl-C and SIGTERM set `stop`, so everything started is stopped in order."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


# ----- running ------------------------------------------------------------------------

async def _serve(settings: KeelSettings, *, ui: bool, require_configured: bool,
                 role: str = "both", keel_ui_port: int | None = None) -> None:
    from activities.db import close_pools
    from keel.demo import running_dev_stack
    from keel.devstack import running_stack
    from workers.observability import shutdown_tracing, worker_interceptors
    from workers.schedules import ensure_memory_schedules
    from workers.worker import Role, build_worker, serve_until

    stop = asyncio.Event()
    _install_stop_signals(stop)
    if not require_configured and (other := await running_dev_stack(settings)):
        raise CliError(f"`keel dev` is already running in {settings.data_dir} (Temporal at "
                       f"{other['temporal_address']}); stop it first, or run `keel worker` "
                       "with TEMPORAL_ADDRESS and DATABASE_URL to add a worker to it")
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
        ui_address = getattr(stack, "ui_address", None) or _dev_ui_address(stack, ui)
        keel_ui = None
        if keel_ui_port is not None:
            from keel.ui.server import ui_server

            keel_ui = await stack_exit.enter_async_context(ui_server(
                KeelClient(stack.client, settings.task_queue, settings), settings,
                stack.database_url, port=keel_ui_port, temporal_ui=ui_address))
        console.print(key_values([
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
        ], title="keel " + ("worker" if require_configured else "dev")
                   + (" (vault)" if role == "vault" else "")))
        worker = build_worker(stack.client, settings,
                              interceptors=worker_interceptors(settings), role=Role(role))
        if role != "sessions":
            console.print(f"[dim]taking the vault lock for {settings.vault_task_queue} "
                          "(a second vault worker stands by here)…[/]")

        async def ready() -> None:
            # The nightly rollups and the doctor, as Temporal Schedules (created or updated).
            await ensure_memory_schedules(stack.client, settings)
            console.print("[green]worker running[/] — Ctrl-C to stop")

        if await serve_until(worker, stop, ready):
            console.print("stopping: worker…")
        console.print("stopping: " + ("connections…" if not stack.embedded else
                                      "Temporal dev server, PostgreSQL…"))
    console.print("[green]stopped[/]")


def _dev_ui_address(stack: Any, ui: bool) -> str | None:
    # The dev server puts its UI on the gRPC port + 1000 unless told otherwise (it prints
    # the same in its banner); running_stack does not pass a UI port.
    if not (ui and stack.embedded):
        return None
    host, _, port = str(stack.temporal_address).rpartition(":")
    return f"http://{host}:{int(port) + 1000}" if port.isdigit() else None


@app.command()
def dev(ui: Annotated[bool, typer.Option(help="Start the Temporal Web UI too.")] = True,
        keel_ui: Annotated[bool, typer.Option(help="Serve Keel's own UI (`keel ui`) too.")]
        = True,
        ui_port: Annotated[int, typer.Option(help="Port of Keel's UI (on 127.0.0.1).")]
        = 8765,
        ) -> None:
    """Start the embedded stack (or use TEMPORAL_ADDRESS / DATABASE_URL) and a worker."""
    from workers.observability import configure_logging

    settings = _settings()
    configure_logging(settings)
    _run(_serve(settings, ui=ui, require_configured=False,
                keel_ui_port=ui_port if keel_ui else None))


@app.command()
def worker(vault: Annotated[bool, typer.Option(
        "--vault", help="Serve the vault's own queue (<queue>-vault): run exactly one, on "
                        "the host that holds the vault folder; a second one stands by.")]
           = False) -> None:
    """Run a worker against a configured cluster (TEMPORAL_ADDRESS and DATABASE_URL): the
    session queue, or with --vault the vault's queue."""
    from workers.observability import configure_logging

    settings = _settings()
    missing = [name for name, value in (("TEMPORAL_ADDRESS", settings.temporal_address),
                                        ("DATABASE_URL", settings.database_url)) if not value]
    if missing:
        error(f"{' and '.join(missing)} not set: `keel worker` serves a configured "
              "cluster. For everything on this machine use `keel dev`.")
        raise typer.Exit(2)
    configure_logging(settings)
    _run(_serve(settings, ui=False, require_configured=True,
                role="vault" if vault else "sessions"))


@app.command()
def demo(
    turns: Annotated[int, typer.Option(min=1, help="Most turns to play.")] = DEFAULT_TURNS,
    session: Annotated[str | None, typer.Option("--session", help="Session id.")] = None,
) -> None:
    """Keel's main job end to end: a 60-PR review queue on a small window, with checkpoints."""
    from keel.demo import run_demo
    from workers.observability import configure_logging

    settings = _settings()
    # The demo's own lines tell the story; logs only for what went wrong.
    configure_logging(settings, level=os.environ.get("KEEL_LOG_LEVEL") or "WARNING")
    result = _run(run_demo(settings, turns=turns, session_id=session))
    if not result.ok:
        raise typer.Exit(1)


@app.command(name="ui")
def ui_command(
    host: Annotated[str, typer.Option(help="Address to bind; anything but loopback needs "
                                           "a token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free one).")] = 8765,
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
        settings = _settings()
        keel = await _connect(settings)
        stop = asyncio.Event()
        _install_stop_signals(stop)
        async with ui_server(keel, settings, _database_url(settings), host=host, port=port,
                             token=token, temporal_ui=temporal_ui) as url:
            console.print(f"Keel UI: [bold]{url}[/] — Ctrl-C to stop")
            await stop.wait()
    _run(main())


# ----- sessions -----------------------------------------------------------------------

@app.command()
def start(
    session_id: Annotated[str | None, typer.Argument(help="Session id (default: new).")
                          ] = None,
    id: Annotated[str | None, typer.Option("--id", help="Session id (default: new).")] = None,
    message: Annotated[str | None, typer.Option("--message", "-m",
                                                help="First message.")] = None,
    agent: Annotated[Path | None, typer.Option(
        "--agent", help="The agent spec: a TOML or JSON file.")] = None,
    instructions: Annotated[Path | None, typer.Option(
        "--instructions", help="A text file with the agent's instructions.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="The model's name.")] = None,
) -> None:
    """Start a session, optionally with its first message (acknowledged in the same call)."""
    spec = _agent_spec(agent, instructions, model)

    async def main() -> None:
        keel = await _connect(_settings())
        sid = session_id or id
        if message is None:
            handle = await keel.start_session(sid, agent=spec)
            console.print(f"started session [bold]{handle.session_id}[/]")
            return
        import uuid

        sid = sid or f"session-{uuid.uuid4().hex[:12]}"
        joined = await keel.session(sid).is_running()
        handle, accepted = await keel.start_with_message(sid, message, agent=spec)
        verb = "joined" if joined else "started"
        console.print(f"{verb} session [bold]{handle.session_id}[/]; message recorded "
                      f"as seq {accepted.seq}")
    _run(main())


def _agent_spec(agent: Path | None, instructions: Path | None,
                model: str | None) -> AgentSpec | None:
    """The spec from `--agent`, with `--instructions` and `--model` on top."""
    if agent is None and instructions is None and model is None:
        return None
    try:
        spec = spec_from_text(agent.read_text(), agent.suffix) if agent else AgentSpec()
        if instructions is not None:
            spec = spec.model_copy(update={"instructions": instructions.read_text()})
    except (OSError, ValueError) as err:
        error(f"the agent spec cannot be read: {one_line(str(err))}")
        raise typer.Exit(1) from None
    if model:
        spec = spec.model_copy(update={"model": model})
    return spec


# ----- the agent's approvals, a session's end, list, compact (issue 8) -----------------

@app.command()
def pending(session: str,
            as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
            ) -> None:
    """Tool calls that wait on a person's approval: tool, input, since when."""
    async def main() -> None:
        calls = await (await _session(session)).pending()
        if as_json:
            console.print_json(json.dumps([c.model_dump(mode="json") for c in calls]))
            return
        if not calls:
            console.print("[dim]no call waits on approval[/]")
            return
        table = Table("call id", "tool", "input", "since")
        for c in calls:
            table.add_row(c.call_id, c.tool, escape(json.dumps(c.input)[:200]),
                          c.since.isoformat(timespec="seconds"))
        console.print(table)
    _run(main())


@app.command()
def approve(session: str, call_id: str,
            by: Annotated[str, typer.Option("--by", help="Who approves.")] = "",
            ) -> None:
    """Approve a pending tool call; the turn goes on and the call runs."""
    async def main() -> None:
        done = await (await _session(session)).approve(
            call_id, by=by or os.environ.get("USER", ""))
        console.print(f"approved {done.tool} (call {done.call_id})")
    _run(main())


@app.command()
def deny(session: str, call_id: str,
         note: Annotated[str, typer.Option("--note", help="What the model is told.")] = "",
         by: Annotated[str, typer.Option("--by", help="Who denies.")] = "",
         ) -> None:
    """Deny a pending tool call; the note is the error result the model gets."""
    async def main() -> None:
        done = await (await _session(session)).deny(
            call_id, note, by=by or os.environ.get("USER", ""))
        console.print(f"denied {done.tool} (call {done.call_id})")
    _run(main())


@app.command(name="list")
def list_(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
          ) -> None:
    """Every session: id, phase, turn, context use, checkpoints, last activity."""
    async def main() -> None:
        sessions = await (await _connect(_settings())).list_sessions()
        if as_json:
            console.print_json(json.dumps([s.model_dump(mode="json") for s in sessions]))
            return
        table = Table("session", "phase", "turn", "context", "checkpoints", "last activity")
        for s in sessions:
            table.add_row(s.session_id, s.phase, str(s.turn), f"{s.context_percent:.0f}%",
                          str(s.checkpoints), s.last_activity)
        console.print(table)
    _run(main())


@app.command()
def end(session: str,
        reason: Annotated[str, typer.Option("--reason", help="Why.")] = "ended on request",
        ) -> None:
    """End a session: it finishes its handlers and completes with its final status."""
    async def main() -> None:
        final = await (await _session(session)).end(reason)
        console.print(f"ended session [bold]{final.session_id}[/] after turn {final.turn}")
    _run(main())


async def _compact(handle: SessionHandle) -> str:
    """A checkpoint now (the same chain and checks as an automatic one), as one line
    saying what it did: the context before and after it."""
    before = await handle.status()
    with working("Checkpointing…"):
        after = await handle.checkpoint_now()
    if after.checkpoint_count == before.checkpoint_count:
        why = f": {escape(after.last_error)}" if after.last_error else " (nothing to condense)"
        return (f"no checkpoint taken{why}; context {after.context_tokens:,} / "
                f"{after.context_window:,} tokens")
    return (f"◆ checkpoint {after.checkpoint_count}: context {before.context_tokens:,} "
            f"tokens before → {after.context_tokens:,} after (window "
            f"{after.context_window:,})")


@app.command()
def compact(session: str) -> None:
    """A checkpoint now, through the same chain and checks as an automatic one."""
    async def main() -> None:
        console.print(await _compact(await _session(session)))
    _run(main())


@app.command()
def send(
    session: str,
    text: str,
    wait: Annotated[bool, typer.Option("--wait", "-w", help="Wait for the reply.")] = False,
) -> None:
    """Send the user's message; prints its seq (and, with --wait, the reply as it streams,
    its tool calls and results, checkpoints, and a footer of context use)."""
    async def main() -> None:
        keel = await _connect(_settings())
        handle = keel.session(session)
        if not wait:
            accepted = await _needs_worker(keel, handle, handle.send(text))
            console.print(f"seq {accepted.seq}")
            return
        await _needs_worker(keel, handle, _say(handle, text, LiveView(console,
                                                                    whole_turns=True)))
    _run(main())


# A command that waits on a session says, after this long, when no worker polls its queue.
NO_WORKER_AFTER_S = float(os.environ.get("KEEL_NO_WORKER_AFTER_S", "10"))
POLLER_FRESH_S = 90  # a poller seen longer ago than this has gone (pollers long-poll 60 s)
CATCH_UP_S = 3.0  # how long a finished turn's events may trail its outcome


async def _needs_worker(keel: KeelClient, handle: SessionHandle,
                        call: Coroutine[Any, Any, T]) -> T:
    """Run `call` (which a worker must serve); if it is still waiting after
    NO_WORKER_AFTER_S and no worker polls the session's task queue, stop and say so."""
    task = asyncio.ensure_future(call)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=NO_WORKER_AFTER_S)
            if done:
                try:
                    return task.result()
                except RPCError as err:
                    # A query fails at once when the server has seen no poller lately, or
                    # times out when the one it saw has gone.
                    if err.status not in (RPCStatusCode.FAILED_PRECONDITION,
                                          RPCStatusCode.CANCELLED,
                                          RPCStatusCode.DEADLINE_EXCEEDED):
                        raise
                    queue = await _queue_without_worker(keel, handle.session_id)
                    if queue is None:
                        raise
                    raise _no_worker(queue, handle.session_id) from err
            queue = await _queue_without_worker(keel, handle.session_id)
            if queue is not None:
                raise _no_worker(queue, handle.session_id)
    finally:
        if not task.done():
            task.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await task


def _no_worker(queue: str, session_id: str) -> CliError:
    return CliError(
        f"no worker polls the task queue {queue!r}: start one with `keel dev` (everything on "
        "this machine) or `keel worker` (TEMPORAL_ADDRESS and DATABASE_URL set); what was "
        f"sent may still be taken when one starts (see `keel record {session_id}`)")


async def _queue_without_worker(keel: KeelClient, session_id: str) -> str | None:
    """The session's task queue when no worker has polled it lately (DescribeTaskQueue's
    pollers), else None."""
    try:
        queue = (await keel.client.get_workflow_handle(session_id).describe()).task_queue
    except RPCError:
        return None  # the call itself will say what is wrong
    described = await keel.client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(namespace=keel.client.namespace,
                                 task_queue=TaskQueue(name=queue),
                                 task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW))
    now = time.time()
    fresh = [p for p in described.pollers
             if not p.HasField("last_access_time")
             or now - p.last_access_time.ToSeconds() < POLLER_FRESH_S]
    return None if fresh else queue


async def _follow(handle: SessionHandle, after: int, view: LiveView) -> None:
    async for offset, event in handle.events(after=after):
        view.show(offset, event)


async def _say(handle: SessionHandle, text: str, view: LiveView,
               reader: asyncio.Task[None] | None = None) -> TurnOutcome | None:
    """Send `text` and show the turn that answers it as it happens, through `reader` (the
    chat's one subscriber) or a reader of its own from the stream's current offset. None
    when the session refused the message (already said)."""
    own = reader is None
    if own:
        after = await handle.event_offset()
        reader = asyncio.create_task(_follow(handle, after, view))
    try:
        if own:  # `send --wait`: the seq first, then what the session does with it
            view.pause()
            try:
                accepted = await handle.send(text)
                console.print(f"seq {accepted.seq}")
            finally:
                view.resume()
            outcome = await handle.wait_reply(accepted.seq)
        else:  # the chat: one update records the message and returns the turn's outcome
            outcome = await handle.ask(text)
        with suppress(TimeoutError):
            async with asyncio.timeout(CATCH_UP_S):
                while not view.outcome_shown(outcome) and not reader.done():
                    await asyncio.sleep(0.02)
        view.show_outcome(outcome)
        return outcome
    finally:
        if own:
            reader.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await reader


class SignalKind(StrEnum):
    watch = "watch"
    task = "task"
    agent_run = "agent-run"
    callback = "callback"


@app.command(name="signal")
def signal_(
    session: str,
    kind: SignalKind,
    text: str,
    id: Annotated[str, typer.Option("--id", help="Watch / task / run id.")],
    name: Annotated[str | None, typer.Option("--name", help="Watch or task name.")] = None,
    from_: Annotated[str | None, typer.Option("--from",
                                              help="Sending session (agent-run, callback).")
                     ] = None,
) -> None:
    """Send a background input; Keel writes its source line from the kind, never the text."""
    needs = {SignalKind.watch: ("--name", name), SignalKind.task: ("--name", name),
             SignalKind.agent_run: ("--from", from_), SignalKind.callback: ("--from", from_)}
    flag, value = needs[kind]
    if not value:
        error(f"{kind.value} needs {flag}")
        raise typer.Exit(2)

    async def main() -> None:
        handle = await _session(session)
        send: dict[SignalKind, Callable[[], Awaitable[None]]] = {
            SignalKind.watch: lambda: handle.watch(id, value, text),
            SignalKind.task: lambda: handle.task(id, value, text),
            SignalKind.agent_run: lambda: handle.agent_run(id, value, text),
            SignalKind.callback: lambda: handle.callback(id, value, text),
        }
        await send[kind]()
        console.print(f"signalled {kind.value} {id} to {session}")
    _run(main())


@app.command()
def status(session: str,
           as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
           ) -> None:
    """Phase, turn, context use and checkpoints of a session."""
    async def main() -> None:
        handle = await _session(session)
        result = await handle.status()
        closed = await handle.closed_as()
        if closed and closed != "completed":  # cancelled or terminated by other means
            result = result.model_copy(update={"stopped_reason": f"the session was {closed}"})
        if as_json:  # plain stdout: no colour codes, no wrapping, for scripts
            sys.stdout.write(result.model_dump_json() + "\n")
        else:
            console.print(_status_table(result))
    _run(main())


def _query_command(name: str, doc: str) -> None:
    def command(session: str) -> None:
        async def main() -> None:
            handle = await _session(session)
            text: str = await getattr(handle, name)()
            console.print(escape(text) if text else f"[dim](no {name} yet: it is written by "
                                                    "the first checkpoint)[/]")
        _run(main())
    command.__doc__ = doc
    app.command(name=name)(command)


_query_command("mind", "The session's mind: where it stands, goals, decisions, lessons.")
_query_command("memo", "The user's own words the session keeps, copied from the record.")
_query_command("now", "The session's working state: step, progress, waiting on, next.")


# ----- the record ---------------------------------------------------------------------

def _database_url(settings: KeelSettings) -> str:
    if settings.database_url:
        return settings.database_url
    from keel.devstack import read_stack_file

    stack = read_stack_file(settings.data_dir)
    if stack and stack.get("database_url"):
        return stack["database_url"]
    raise CliError("no PostgreSQL to read: set DATABASE_URL, or run `keel dev` first")


@app.command()
def record(
    session: str,
    user: Annotated[bool, typer.Option("--user", help="Only the user's own messages.")] = False,
    from_seq: Annotated[int, typer.Option("--from", help="First seq.")] = 1,
    limit: Annotated[int, typer.Option(help="Most rows (at most 1,000).")] = 200,
    full: Annotated[bool, typer.Option("--full", help="Whole texts, not one line.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a row.")] = False,
) -> None:
    """The conversation of record, read from PostgreSQL: seq, type, source line, text."""
    settings = _settings()

    def read() -> tuple[bool, list[RecordEntry]]:
        with psycopg.connect(_database_url(settings)) as conn:
            known = conn.execute("SELECT 1 FROM sessions WHERE session_id = %s",
                                 (session,)).fetchone()
            rows = read_record(conn, session, from_seq=from_seq, user_only=user, limit=limit)
        return known is not None, rows

    try:
        known, rows = read()
    except Exception as err:
        line = failure_line(err)
        if line is None or os.environ.get("KEEL_TRACEBACK"):
            raise
        error(line)
        raise typer.Exit(1) from None
    if not known:
        error(f"no session {session!r} in the record: is the session id right?")
        raise typer.Exit(1)
    if as_json:
        for row in rows:
            sys.stdout.write(json.dumps({"seq": row.seq, "type": row.type,
                                         "source_line": row.source_line, "text": row.text,
                                         "tokens": row.token_count, "turn": row.turn}) + "\n")
        return
    if not rows:
        console.print(f"[dim]no messages for {session} from seq {from_seq}[/]")
        return
    # Plain aligned lines rather than a table: a table squeezes the text column to
    # nothing on a narrow terminal or a pipe, and these rows are mostly text.
    console.print(f"[dim]{'seq':>5}  {'type':<11} {'tokens':>6}  source line / text[/]")
    for row in rows:
        body = row.text if full else one_line(row.text, 160)
        source = f"[yellow]{escape(row.source_line)}[/] " if row.source_line else ""
        console.print(f"{row.seq:>5}  [cyan]{row.type:<11}[/] [dim]{row.token_count:>6}[/]  "
                      f"{source}{escape(body)}", soft_wrap=not full)


# ----- workspace files ----------------------------------------------------------------
# Like `keel record`, these read and write the workspace store directly (PostgreSQL, or
# the local folder of the embedded default): the client helper `keel.client` stays free of
# database code, and a session's files need no running workflow to be read.

async def _with_store(settings: KeelSettings, use: Callable[[Any], Awaitable[T]]) -> T:
    from activities.workspace import StoreError, open_store

    url = _database_url(settings) if settings.workspace_store == "postgres" else None
    try:
        return await use(open_store(settings, database_url=url, pooled=False))
    except StoreError as err:
        raise CliError(str(err)) from None
    except psycopg.Error as err:
        raise CliError(f"PostgreSQL: {err}") from None


@app.command()
def files(
    session: str,
    path: Annotated[str | None, typer.Argument(help="A file to print (default: list).")]
    = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", dir_okay=False,
                                             help="Save the file's bytes here.")] = None,
) -> None:
    """A session's workspace: its files (path, size, version), or one file's text."""
    async def main(store: Any) -> None:
        if path is None:
            found = await store.list(session)
            if not found:
                console.print(f"[dim]no files in the workspace of {session}[/]")
            for f in found:
                console.print(f"{f.size:>10,}  v{f.version:<4} {escape(f.path)}")
            return
        stored = await store.read(session, path)
        if stored is None:
            raise CliError(f"no file {path!r} in the workspace of {session}")
        if out is not None:
            out.write_bytes(stored.data)
            console.print(f"saved {path} (v{stored.version}, {len(stored.data):,} bytes) "
                          f"to {out}")
            return
        try:
            text = stored.data.decode("utf-8")
        except UnicodeDecodeError:
            raise CliError(f"{path} is a binary file, {len(stored.data):,} bytes: "
                           "save it with --out") from None
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    _run(_with_store(_settings(), main))


@app.command()
def put(
    session: str,
    path: Annotated[str, typer.Argument(help="Where in the workspace.")],
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False,
                                         help="The local file to copy in.")],
) -> None:
    """Copy a local file into a session's workspace (`_shared skills/NAME/SKILL.md` adds a
    skill every session sees)."""
    async def main(store: Any) -> None:
        version = await store.write(session, path, file.read_bytes())
        console.print(f"put {path} into {session} (v{version})")
    _run(_with_store(_settings(), main))


# ----- replay -------------------------------------------------------------------------

def _replay_workflows() -> list[type]:
    from workflows.session import SessionWorkflow

    try:  # the long-memory workflows, where that part is installed
        from workers.worker import MEMORY_WORKFLOWS
    except ImportError:
        return [SessionWorkflow]
    return [SessionWorkflow, *MEMORY_WORKFLOWS]


@app.command()
def replay(
    session: str,
    history_file: Annotated[list[Path] | None, typer.Option(
        "--history-file", exists=True, dir_okay=False,
        help="Replay a saved JSON history instead of fetching (repeatable).")] = None,
    save: Annotated[Path | None, typer.Option(
        "--save", file_okay=False,
        help="Save each fetched run's history as JSON into this folder.")] = None,
    run_id: Annotated[str | None, typer.Option(
        "--run-id", help="Only this run of the session (default: every run).")] = None,
) -> None:
    """Replay a session's history against this code, every run of it (a session continues
    as new to keep each history bounded): exit 0 when all replay deterministically, 1 with
    the nondeterminism error otherwise."""
    async def main() -> bool:
        if history_file:
            histories = [WorkflowHistory.from_json(session, f.read_text()) for f in history_file]
        else:
            keel = await _connect(_settings())
            with working("Fetching the history…"):
                if run_id:
                    runs = [run_id]
                else:
                    found = [e async for e in keel.client.list_workflows(
                        f"WorkflowId = '{session}'")]
                    runs = [e.run_id for e in sorted(found, key=lambda e: e.start_time)]
                if not runs:
                    raise CliError(f"not found: no session {session}")
                histories = [await keel.client.get_workflow_handle(
                    session, run_id=r).fetch_history() for r in runs]
            if save is not None:
                save.mkdir(parents=True, exist_ok=True)
                for n, history in enumerate(histories, 1):
                    path = save / f"{session}-run{n}.json"
                    path.write_text(history.to_json())
                    console.print(f"saved run {n} to {path}")
        from workers.payload_refs import worker_converter

        # The worker's own converter: a foreign payload reference replays as it ran.
        replayer = Replayer(workflows=_replay_workflows(),
                            data_converter=worker_converter(pydantic_data_converter))
        ok = True
        for history in histories:
            if not history.events:
                raise CliError(f"the history of {session} is empty")
            events = len(history.events)
            cont = any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
                       for e in history.events)
            with working(f"Replaying {events} events…"):
                result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
            run = history.run_id
            if result.replay_failure is None:
                console.print(f"[bold green]✓ {session} (run {run}) replays deterministically[/]"
                              f" ({events} events{', ended in continue-as-new' if cont else ''})")
                continue
            ok = False
            console.print(f"[bold red]✗ {session} (run {run}) does not replay "
                          f"deterministically[/]")
            console.print(escape(f"{type(result.replay_failure).__name__}: "
                                 f"{result.replay_failure}"))
        return ok
    if not _run(main()):
        raise typer.Exit(1)


# ----- chat ---------------------------------------------------------------------------

CHAT_HELP = ("/new starts a fresh session · /status /mind /memo /now show its state · "
             "/compact takes a checkpoint now · /quit leaves (the session keeps running)")


@app.command()
def chat(id: Annotated[str | None, typer.Option("--id", help="Session to join or start.")]
         = None) -> None:
    """Talk to a session interactively."""
    async def open_session(keel: KeelClient, session_id: str | None) -> SessionHandle:
        try:
            handle = await keel.start_session(session_id)
            console.print(f"[dim]started session[/] [bold]{handle.session_id}[/]")
        except SessionExistsError:
            assert session_id is not None
            handle = keel.session(session_id)
            console.print(f"[dim]joined session[/] [bold]{session_id}[/]")
        return handle

    async def main() -> None:
        keel = await _connect(_settings())
        handle = await open_session(keel, id)
        console.print(f"[dim]{CHAT_HELP}[/]")
        view = ChatView(console, whole_turns=True)
        # One subscriber per session for the whole chat: it shows background inputs and
        # the replies to them whenever they come, the person's own turns too.
        reader = await _chat_reader(keel, handle, view)
        try:
            while True:
                try:
                    view.prompting = True
                    line = await asyncio.to_thread(Prompt.ask, "[bold]you[/]",
                                                   console=console)
                except (EOFError, KeyboardInterrupt):
                    break
                finally:
                    view.prompting = False
                text = line.strip()
                if not text:
                    continue
                if text in ("/quit", "/exit"):
                    break
                if text == "/new":
                    reader.cancel()
                    handle = await open_session(keel, None)
                    reader = await _chat_reader(keel, handle, view)
                elif text == "/status":
                    console.print(_status_table(await handle.status()))
                elif text == "/compact":
                    try:
                        console.print(await _compact(handle))
                    except MessageRejectedError as err:  # an ended session, say
                        error(_refusal_line(err))
                elif text in ("/mind", "/memo", "/now"):
                    shown: str = await getattr(handle, text[1:])()
                    console.print(escape(shown) if shown else f"[dim](no {text[1:]} yet)[/]")
                elif text.startswith("/") and not text.startswith("//"):
                    console.print(f"[dim]unknown command; {CHAT_HELP}[/]")
                else:
                    try:
                        await _needs_worker(keel, handle, _say(handle, text, view, reader))
                    except MessageRejectedError as err:
                        error(_refusal_line(err))
        finally:
            reader.cancel()
        console.print(f"[dim]left {handle.session_id}; it keeps running.[/]")
    _run(main())


# ----- vault: long memory per scope ------------------------------------------------------

vault_app = typer.Typer(name="vault", no_args_is_help=True,
                        help="Long memory: list scopes; doctor, rollup and search one scope.")
app.add_typer(vault_app, name="vault")

ScopeOption = Annotated[str, typer.Option("--scope", help="Whose memory (a scope id).")]


def _check_scope(scope: str) -> str:
    from schemas.vault.scope import ScopeError, check_scope

    try:
        return check_scope(scope)
    except ScopeError as err:
        raise CliError(str(err)) from None


@vault_app.command("list")
def vault_list() -> None:
    """Every memory scope that has a vault: its folder, CORE.md size, git state."""
    from activities.vault.store import scope_vaults

    settings = _settings()
    scopes = scope_vaults(settings.memory)
    if not scopes:
        console.print("[dim]no vault yet: a session's first message creates its scope's[/]")
        return
    table = Table("scope", "vault", "CORE.md chars", "git")
    for scope, path in scopes.items():
        core = path / "CORE.md"
        table.add_row(scope, str(path), str(len(core.read_text()) if core.exists() else 0),
                      "yes" if (path / ".git").exists() else "[red]not a repository[/]")
    console.print(table)


async def _run_memory_workflow(settings: KeelSettings, run: Any, arg: Any, wid: str) -> Any:
    import uuid

    keel = await _connect(settings)
    with working(f"running {wid}…"):
        return await keel.client.execute_workflow(
            run, arg, id=f"{wid}-{uuid.uuid4().hex[:8]}", task_queue=settings.vault_task_queue)


@vault_app.command("doctor")
def vault_doctor(scope: ScopeOption = "default") -> None:
    """Run the doctor now for one scope (a worker must be running)."""
    from schemas.vault.doctor import DoctorInput
    from workflows.doctor import DoctorWorkflow

    settings = _settings()

    async def main() -> None:
        report = await _run_memory_workflow(
            settings, DoctorWorkflow.run, DoctorInput(scope=_check_scope(scope)),
            f"keel-doctor-now-{scope}")
        console.print(escape(report.text()))

    _run(main())


class _Kind(StrEnum):
    daily = "daily"
    weekly = "weekly"
    monthly = "monthly"
    yearly = "yearly"


@vault_app.command("rollup")
def vault_rollup(kind: Annotated[_Kind, typer.Argument(help="Which rollup.")] = _Kind.daily,
                 scope: ScopeOption = "default") -> None:
    """Run a rollup now for one scope: its due periods, missed ones included."""
    from schemas.vault.rollup import RollupInput, RollupKind
    from workflows.rollup import ROLLUP_WORKFLOWS

    settings = _settings()
    rk = RollupKind(kind.value)

    async def main() -> None:
        report = await _run_memory_workflow(
            settings, ROLLUP_WORKFLOWS[rk].run,
            RollupInput(kind=rk, scope=_check_scope(scope)), f"keel-rollup-now-{rk.value}-{scope}")
        console.print(escape(report.text()))

    _run(main())


@vault_app.command("search")
def vault_search(query: str, scope: ScopeOption = "default",
                 limit: Annotated[int, typer.Option(help="Most hits.")] = 5) -> None:
    """Search one scope's long memory (BM25 + graph rerank), read from PostgreSQL."""
    from activities.vault.search import search

    settings = _settings()

    async def main() -> None:
        url = _database_url(settings)
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                hits = await search(conn, query, scope=_check_scope(scope), k=max(1, limit))
        except psycopg.Error as err:
            raise CliError(f"PostgreSQL: {err}") from None
        if not hits:
            console.print(f"[dim]nothing in {scope}'s memory for {query!r}[/]")
        for hit in hits:
            console.print(f"[cyan]{escape(hit.path)}[/] [dim]{hit.score:.3f}[/]  "
                          f"{escape(one_line(hit.snippet, 160))}")

    _run(main())


class ChatView(LiveView):
    """The chat's view: an event that arrives while the person is at the prompt is printed
    above it, and the prompt is shown again."""

    prompting = False

    def _line(self, markup: str) -> None:
        if self.prompting and not self.mid_line:
            self.console.print()
            super()._line(markup)
            self.console.print("[bold]you[/]: ", end="")
            return
        super()._line(markup)


async def _chat_reader(keel: KeelClient, handle: SessionHandle, view: LiveView
                       ) -> asyncio.Task[None]:
    after = await _needs_worker(keel, handle, handle.event_offset())
    return asyncio.create_task(_follow(handle, after, view))


@app.command()
def tail(
    session: str,
    from_: Annotated[int | None, typer.Option(
        "--from", help="First offset to show (default: only what happens from now).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a line.")] = False,
) -> None:
    """Follow a session's events: inputs, streamed replies, tool calls, checkpoints, errors.
    Ends when the session ends; Ctrl-C leaves."""
    async def main() -> None:
        keel = await _connect(_settings())
        handle = keel.session(session)
        after = from_ if from_ is not None else await _needs_worker(
            keel, handle, handle.event_offset())
        view = LiveView(console)
        async for offset, event in handle.events(after=after):
            if as_json:
                sys.stdout.write(json.dumps(event_dict(offset, event)) + "\n")
                sys.stdout.flush()
            else:
                view.show(offset, event)
    _run(main())


def main() -> None:  # `python -m keel.cli`
    app()


if __name__ == "__main__":
    main()
