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
import signal
import sys
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
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
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


def _run(main: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; known failures become one readable line and exit 1."""
    try:
        return asyncio.run(main)
    except CliError as err:
        error(str(err))
    except KeelError as err:  # a refusal by type (keel._errors): its one line
        error(str(err))
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            error(f"not found: {err.message} (is the session id right?)")
        elif err.status == RPCStatusCode.UNAVAILABLE:
            error(f"Temporal is unreachable: {err.message}")
        else:
            error(f"Temporal answered {err.status.name if err.status else 'an error'}: "
                  f"{err.message}")
    except RuntimeError as err:  # e.g. the client could not connect to the address
        error(f"{err}: {err.__cause__}" if err.__cause__ else str(err))
    raise typer.Exit(1)


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


def _print_outcome(outcome: TurnOutcome) -> None:
    if outcome.error:
        console.print(f"[red]{escape(outcome.error)}[/]")
    if outcome.reply_text:
        console.print(f"[bold green]keel[/]: {escape(outcome.reply_text)}")
    if outcome.stopped_reason and outcome.stopped_reason != outcome.error:
        console.print(f"[yellow]{escape(outcome.stopped_reason)}[/]")


def _install_stop_signals(stop: asyncio.Event) -> None:
    """Ctrl-C and SIGTERM set `stop`, so everything started is stopped in order."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


# ----- running ------------------------------------------------------------------------

async def _serve(settings: KeelSettings, *, ui: bool, require_configured: bool) -> None:
    from activities.db import close_pools
    from keel.demo import running_dev_stack
    from keel.devstack import running_stack
    from workers.observability import shutdown_tracing, worker_interceptors
    from workers.schedules import ensure_memory_schedules
    from workers.worker import build_worker

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
        console.print(key_values([
            ("Temporal", stack.temporal_address
             + (" (embedded dev server, SQLite file under the data dir)"
                if stack.embedded else "")),
            *([("Temporal UI", ui_address)] if ui_address else []),
            ("PostgreSQL", redact_url(stack.database_url)),
            ("task queue", settings.task_queue),
            ("namespace", settings.temporal_namespace),
            ("model", "offline deterministic model (no API key)" if settings.model.offline
             else settings.model.name),
            ("data dir", settings.data_dir),
        ], title="keel " + ("worker" if require_configured else "dev")))
        worker = build_worker(stack.client, settings,
                              interceptors=worker_interceptors(settings))
        async with worker:
            # The nightly rollups and the doctor, as Temporal Schedules (created or updated).
            await ensure_memory_schedules(stack.client, settings)
            console.print("[green]worker running[/] — Ctrl-C to stop")
            await stop.wait()
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
        ) -> None:
    """Start the embedded stack (or use TEMPORAL_ADDRESS / DATABASE_URL) and a worker."""
    from workers.observability import configure_logging

    settings = _settings()
    configure_logging(settings)
    _run(_serve(settings, ui=ui, require_configured=False))


@app.command()
def worker() -> None:
    """Run a worker against a configured cluster (TEMPORAL_ADDRESS and DATABASE_URL)."""
    from workers.observability import configure_logging

    settings = _settings()
    missing = [name for name, value in (("TEMPORAL_ADDRESS", settings.temporal_address),
                                        ("DATABASE_URL", settings.database_url)) if not value]
    if missing:
        error(f"{' and '.join(missing)} not set: `keel worker` serves a configured "
              "cluster. For everything on this machine use `keel dev`.")
        raise typer.Exit(2)
    configure_logging(settings)
    _run(_serve(settings, ui=False, require_configured=True))


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


@app.command()
def compact(session: str) -> None:
    """A checkpoint now, through the same chain and checks as an automatic one."""
    async def main() -> None:
        with working("Checkpointing…"):
            after = await (await _session(session)).checkpoint_now()
        console.print(f"checkpoints: {after.checkpoint_count}; context "
                      f"{after.context_tokens:,} / {after.context_window:,} tokens")
    _run(main())


@app.command()
def send(
    session: str,
    text: str,
    wait: Annotated[bool, typer.Option("--wait", "-w", help="Wait for the reply.")] = False,
) -> None:
    """Send the user's message; prints its seq (and the reply with --wait)."""
    async def main() -> None:
        handle = await _session(session)
        accepted = await handle.send(text)
        console.print(f"seq {accepted.seq}")
        if wait:
            with working("Waiting for the reply…"):
                outcome = await handle.wait_reply(accepted.seq)
            _print_outcome(outcome)
    _run(main())


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
        if as_json:
            console.print_json(result.model_dump_json())
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
    limit: Annotated[int, typer.Option(help="Most rows.")] = 200,
    full: Annotated[bool, typer.Option("--full", help="Whole texts, not one line.")] = False,
) -> None:
    """The conversation of record, read from PostgreSQL: seq, type, source line, text."""
    settings = _settings()
    try:
        url = _database_url(settings)
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                "SELECT seq, type, source_line, content_text, token_count FROM messages"
                " WHERE session_id = %s AND seq >= %s AND (NOT %s OR type = 'user')"
                " ORDER BY seq LIMIT %s", (session, from_seq, user, limit)).fetchall()
    except CliError as err:
        error(str(err))
        raise typer.Exit(1) from None
    except psycopg.Error as err:
        error(f"PostgreSQL: {err}")
        raise typer.Exit(1) from None
    if not rows:
        console.print(f"[dim]no messages for {session} from seq {from_seq}[/]")
        return
    # Plain aligned lines rather than a table: a table squeezes the text column to
    # nothing on a narrow terminal or a pipe, and these rows are mostly text.
    console.print(f"[dim]{'seq':>5}  {'type':<11} {'tokens':>6}  source line / text[/]")
    for seq, type_, source_line, text, tokens in rows:
        body = text if full else one_line(text, 160)
        source = f"[yellow]{escape(source_line)}[/] " if source_line else ""
        console.print(f"{seq:>5}  [cyan]{type_:<11}[/] [dim]{tokens:>6}[/]  {source}"
                      f"{escape(body)}", soft_wrap=not full)


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
        replayer = Replayer(workflows=_replay_workflows(),
                            data_converter=pydantic_data_converter)
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
             "/quit leaves (the session keeps running)")


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
        while True:
            try:
                line = await asyncio.to_thread(Prompt.ask, "[bold]you[/]", console=console)
            except (EOFError, KeyboardInterrupt):
                break
            text = line.strip()
            if not text:
                continue
            if text in ("/quit", "/exit"):
                break
            if text == "/new":
                handle = await open_session(keel, None)
            elif text == "/status":
                console.print(_status_table(await handle.status()))
            elif text in ("/mind", "/memo", "/now"):
                shown: str = await getattr(handle, text[1:])()
                console.print(escape(shown) if shown else f"[dim](no {text[1:]} yet)[/]")
            elif text.startswith("/") and not text.startswith("//"):
                console.print(f"[dim]unknown command; {CHAT_HELP}[/]")
            else:
                try:
                    accepted = await handle.send(text)
                except MessageRejectedError as err:
                    error(str(err))
                    continue
                with working("thinking…"):
                    outcome = await handle.wait_reply(accepted.seq)
                _print_outcome(outcome)
        console.print(f"[dim]left {handle.session_id}; it keeps running.[/]")
    _run(main())


def main() -> None:  # `python -m keel.cli`
    app()


if __name__ == "__main__":
    main()
