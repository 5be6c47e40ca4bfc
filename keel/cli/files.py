"""The workspace commands: a session's files listed, printed, saved, and put; and the
local files a message carries put there first (`put_attachments`: `keel send --attach`, the
chat's /attach).

Invariants: these read and write the workspace store directly (PostgreSQL, or the local
folder of the embedded default), as `keel record` reads the record: a session's files need
no running workflow to be read, and `keel.client` stays free of database code. A store's
refusal or a database failure is one line.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import psycopg
import typer
from rich.markup import escape

from keel.cli.shell import CliError, database_url, load_settings, run
from keel.console import console
from keel.uploads import Upload, UploadRefused, checked, read_within
from keel.uploads import put as uploads_put
from schemas.config import KeelSettings
from schemas.files import limit_text, normal_path
from schemas.text import visible

if TYPE_CHECKING:  # the store's code loads only when a command opens one
    from activities.workspace import WorkspaceStore

__all__ = ["attachment_names", "files", "put", "put_attachments"]

T = TypeVar("T")


async def _with_store(settings: KeelSettings, use: Callable[[WorkspaceStore], Awaitable[T]]) -> T:
    from activities.workspace import StoreError, open_store

    url = database_url(settings) if settings.workspace_store == "postgres" else None
    try:
        return await use(open_store(settings, database_url=url, pooled=False))
    except StoreError as err:
        raise CliError(str(err)) from None
    except psycopg.Error as err:
        raise CliError(f"PostgreSQL: {err}") from None


def files(
    session: str,
    path: Annotated[str | None, typer.Argument(help="A file to print (default: list).")]
    = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", dir_okay=False,
                                             help="Save the file's bytes here.")] = None,
) -> None:
    """A session's workspace: its files (path, size, version), or one file's text."""
    async def main(store: WorkspaceStore) -> None:
        if path is None:
            await _list(store, session)
        else:
            await _show(store, session, path, out)
    run(_with_store(load_settings(), main))


async def _list(store: WorkspaceStore, session: str) -> None:
    found = await store.list(session)
    if not found:
        console.print(f"[dim]no files in the workspace of {escape(session)}[/]")
    for f in found:
        console.print(f"{f.size:>10,}  v{f.version:<4} {escape(f.path)}")


async def _show(store: WorkspaceStore, session: str, path: str, out: Path | None) -> None:
    stored = await store.read(session, path)
    if stored is None:
        raise CliError(f"no file {path!r} in the workspace of {session}")
    if out is not None:
        out.write_bytes(stored.data)
        console.print(f"saved {escape(str(path))} (v{stored.version}, {len(stored.data):,} bytes) "
                      f"to {out}")
        return
    try:
        text = stored.data.decode("utf-8")
    except UnicodeDecodeError:
        raise CliError(f"{path} is a binary file, {len(stored.data):,} bytes: "
                       "save it with --out") from None
    # A terminal is shown the file's control characters, a pipe gets its bytes.
    shown = visible(text) if sys.stdout.isatty() else text
    sys.stdout.write(shown if shown.endswith("\n") else shown + "\n")


def put(
    session: str,
    path: Annotated[str, typer.Argument(help="Where in the workspace.")],
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False,
                                         help="The local file to copy in.")],
) -> None:
    """Copy a local file into a session's workspace (`_shared skills/NAME/SKILL.md` adds a
    skill every session sees); a PATH ending in / is a folder, the file keeps its name."""
    settings = load_settings()
    target = path + file.name if path.endswith(("/", "\\")) else path

    async def main(store: WorkspaceStore) -> None:
        version = await store.write(session, target, _read_within(file, target, settings))
        # Where the store keeps it (`a\b`, `a//b` and `a/./b` are all `a/b`).
        console.print(f"put {escape(normal_path(target))} into {session} (v{version})")
    run(_with_store(settings, main))


def _read_within(file: Path, target: str, settings: KeelSettings) -> bytes:
    """The file's bytes, never more than the store could take (a file of gigabytes is
    refused by its size, not read whole first); the store's own check decides the rest."""
    from activities.workspace import KEPT_RESULT_MAX_BYTES

    most = max(settings.max_file_bytes, KEPT_RESULT_MAX_BYTES)
    with file.open("rb") as f:
        data = f.read(most + 1)
    if len(data) > most:
        raise CliError(limit_text(repr(target), file.stat().st_size, settings.max_file_bytes))
    return data


async def put_attachments(settings: KeelSettings, session: str, local: Sequence[Path]
                          ) -> list[str]:
    """Local files put in the session's workspace for its next message (keel.uploads); their
    workspace paths. What the session would refuse is refused before any is put."""
    uploads = attachment_names(settings, local)
    return await _with_store(settings, lambda store: uploads_put(store, session, uploads))


def attachment_names(settings: KeelSettings, local: Sequence[Path]) -> list[Upload]:
    """Each local file's workspace path and bytes, or the session's refusal of them
    (`CliError`) before any is put."""
    try:
        read = []
        for file in local:
            with file.open("rb") as f:
                read.append((file.name, read_within(f, file.name, settings.max_file_bytes)))
        return checked(read)
    except UploadRefused as err:
        raise CliError(str(err)) from None
