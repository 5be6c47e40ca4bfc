"""What every command stands on: the process's entry point, one-line failures, and where
Temporal and PostgreSQL are.

Invariants: a command's ordinary failure ends as one line saying what to do and exit 1
(Ctrl-C: one line and exit 130), never a traceback (KEEL_TRACEBACK=1 shows one); only an
unexpected error (a bug) gets a traceback. Commands other than `dev`, `worker` and `demo`
find Temporal through TEMPORAL_ADDRESS, PostgreSQL through DATABASE_URL, else through the
stack file `keel dev` writes under KEEL_DATA_DIR.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import os
import re
import signal
import sys
import traceback
from collections.abc import Callable, Coroutine
from contextlib import suppress
from typing import Any, NoReturn, TypeVar

import psycopg
import typer
from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from keel.client import KeelClient, KeelError, SessionHandle
from keel.console import error, one_line, working
from schemas.config import KeelSettings
from workers.connect import NoNamespaceError

__all__ = [
    "INTERRUPTED",
    "CliError",
    "Commands",
    "KeelApp",
    "connect",
    "database_url",
    "fail",
    "failure_line",
    "given_text",
    "install_stop_signals",
    "load_settings",
    "refusal_line",
    "run",
    "session_handle",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def summary(doc: str | None) -> str | None:
    """A docstring's first paragraph on one line: what a command list shows. Typer's rich
    help keeps a paragraph's line breaks there, so a summary wrapped in the source came out
    broken mid-sentence."""
    if not doc:
        return None
    return " ".join(inspect.cleandoc(doc).split("\n\n", 1)[0].split())


class Commands(typer.Typer):
    """A command group whose list shows each command's summary as one paragraph."""

    def command(self, name: str | None = None, **kwargs: Any) -> Callable[[F], F]:
        register = super().command

        def decorate(f: F) -> F:
            if "short_help" not in kwargs:
                kwargs["short_help"] = summary(kwargs.get("help") or f.__doc__)
            return register(name, **kwargs)(f)
        return decorate


class KeelApp(Commands):
    """What the console script runs (`keel._entry.main`), ending the process itself.

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


class CliError(Exception):
    """A failure to report in one line (no traceback) with exit code 1."""


# How Temporal's server and SDK render a failure's metadata inside a message: noise to a
# person, and "retryable: true" on a refusal would say the opposite of what it means.
_FAILURE_METADATA = re.compile(r"\s*\((?:type: [^()]*, )?retryable: (?:true|false)\)")

INTERRUPTED = ("interrupted (Ctrl-C); sessions keep running in Temporal: "
               "`keel status SESSION` shows one")


def refusal_line(err: BaseException) -> str:
    """A refusal as one readable line, without the failure's type / retryable metadata."""
    return one_line(_FAILURE_METADATA.sub("", str(err)), width=10_000)


def run(main: Coroutine[Any, Any, T]) -> T:
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
        fail(err)


STDIN = "-"  # a text argument that says: read it from standard input


def given_text(text: str) -> str:
    """A command's text argument, or standard input's whole text when it is `-` (a long
    message: one argument of the command line holds at most 128 KiB on Linux)."""
    if text != STDIN:
        return text
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CliError(f"standard input is not UTF-8 text (byte {err.start}): nothing was "
                       "sent") from None


def fail(err: Exception) -> NoReturn:
    """End the command on `err`: its one line and exit 1 when it is an ordinary failure
    (`failure_line`); a bug, or any failure under KEEL_TRACEBACK=1, goes on up."""
    line = failure_line(err)
    if line is None or os.environ.get("KEEL_TRACEBACK"):
        raise err
    error(line)
    raise typer.Exit(1) from None


def failure_line(err: BaseException) -> str | None:
    """The one line for an ordinary failure, by its type; None for a bug (a traceback)."""
    if isinstance(err, CliError | KeelError):  # KeelError: a refusal by type (keel._errors)
        return refusal_line(err)
    if isinstance(err, RPCError):
        return _temporal_line(err)
    if isinstance(err, NoNamespaceError):  # a worker's start (workers.connect)
        return str(err)
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


def _temporal_line(err: RPCError) -> str:
    if err.status == RPCStatusCode.NOT_FOUND and err.message.startswith("Namespace "):
        return f"Temporal: {err.message} Check TEMPORAL_NAMESPACE."
    if err.status == RPCStatusCode.NOT_FOUND:
        return f"not found: {err.message} (is the session id right?)"
    if err.status == RPCStatusCode.UNAVAILABLE:
        return (f"Temporal is unreachable ({err.message}): check TEMPORAL_ADDRESS, or "
                "start the stack with `keel dev`")
    return (f"Temporal answered {err.status.name if err.status else 'an error'}: "
            f"{err.message}")


def load_settings() -> KeelSettings:
    """The settings from the environment (`KeelSettings.from_env`), read per command; one
    the environment gives wrong ends the command in one line naming it, exit 1 (inside
    `run` or not: `dev`, `worker` and `vault` read them first)."""
    try:
        return KeelSettings.from_env()
    except ValueError as err:
        error(f"a setting is wrong: {one_line(str(err), width=10_000)}")
        raise typer.Exit(1) from None


def _temporal_address(settings: KeelSettings) -> str:
    """TEMPORAL_ADDRESS, else the dev stack `keel dev` runs under KEEL_DATA_DIR."""
    return settings.temporal_address or _from_dev_stack(
        settings, "temporal_address",
        "no Temporal to talk to: set TEMPORAL_ADDRESS, or run `keel dev` first")


def database_url(settings: KeelSettings) -> str:
    """DATABASE_URL, else the embedded PostgreSQL of the dev stack under KEEL_DATA_DIR."""
    return settings.database_url or _from_dev_stack(
        settings, "database_url",
        "no PostgreSQL to read: set DATABASE_URL, or run `keel dev` first")


def _from_dev_stack(settings: KeelSettings, key: str, missing: str) -> str:
    """What the dev stack under KEEL_DATA_DIR wrote under `key`, or CliError(`missing`)."""
    from keel.devstack import read_stack_file

    stack = read_stack_file(settings.data_dir)
    if stack and stack.get(key):
        return stack[key]
    raise CliError(missing)


async def connect(settings: KeelSettings) -> KeelClient:
    address = _temporal_address(settings)
    with working("Connecting to Temporal…"):
        return await KeelClient.connect(settings, address)


async def session_handle(session_id: str) -> SessionHandle:
    return (await connect(load_settings())).session(session_id)


def install_stop_signals(stop: asyncio.Event) -> None:
    """Ctrl-C and SIGTERM set `stop`, so everything started is stopped in order; a second
    one has its default effect (Ctrl-C: interrupted now), for a person who will not wait
    for what runs to finish."""
    loop = asyncio.get_running_loop()

    def first(sig: signal.Signals) -> None:
        stop.set()
        loop.remove_signal_handler(sig)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, first, sig)
