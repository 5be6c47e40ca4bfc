"""`keel vault`: long memory per scope; list the vaults, run the doctor or a rollup now,
search one scope or show one of its documents, forget one of its cards, or erase it.

Invariants: a scope id is checked before anything runs; the doctor and the rollups run as
the same workflows the schedules start, on the vault's own task queue (a worker must serve
it); a search reads PostgreSQL only through `keel.record`; an erasure, which cannot be
undone, asks once more unless --yes.
"""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Annotated, Any, cast

import psycopg
import typer
from rich.markup import escape
from rich.table import Table

from keel.cli.shell import CliError, Commands, connect, database_url, load_settings, run
from keel.console import console, one_line, working
from keel.record import (
    TranscriptBacklog,
    indexed_scopes,
    known_scopes,
    read_memory,
    search_memory,
    transcript_backlog,
)
from schemas.config import KeelSettings
from schemas.vault.nightly import NightlyJob, now_run_prefix
from schemas.vault.scope import unknown_scope_text

__all__ = ["vault_app"]

vault_app = Commands(name="vault", no_args_is_help=True,
                        help="Long memory: list scopes; doctor, rollup, search or erase one scope, "
                     "or forget one card.")

ScopeOption = Annotated[str, typer.Option("--scope", help="Whose memory (a scope id).")]


def _check_scope(scope: str) -> str:
    from schemas.vault.scope import ScopeError, check_scope

    try:
        return check_scope(scope)
    except ScopeError as err:
        raise CliError(str(err)) from None


def _existing_scope(settings: KeelSettings, scope: str) -> str:
    """`scope`, checked, when it is a scope of this deployment (its vault folder here, or
    PostgreSQL knows it); a CliError naming the scopes there are otherwise: a doctor or a
    rollup run on a mistyped scope would make it one (a vault, a repository, CORE.md)."""
    from activities.vault.context import scope_vaults

    scope = _check_scope(scope)
    try:
        known = set(scope_vaults(settings.memory)) | known_scopes(database_url(settings))
    except psycopg.Error as err:
        raise CliError(f"PostgreSQL: {err}") from None
    if scope not in known:
        raise CliError(unknown_scope_text(scope, list(known)))
    return scope


@vault_app.command("list")
def vault_list() -> None:
    """Every memory scope: its vault's folder where it is on this host, CORE.md size, git
    state, the documents its search index holds, and the transcripts still queued for the
    vault worker."""
    from activities.vault.context import scope_vaults

    settings = load_settings()
    scopes = scope_vaults(settings.memory)
    backlog = {b.scope: b for b in _backlog(settings)}
    indexed = _indexed(settings)
    if not scopes and not backlog and not indexed:
        console.print("[dim]no vault yet: a session's first message creates its scope's[/]")
        return
    table = Table("scope", "vault", "CORE.md chars", "git", "documents", "transcripts queued")
    for scope in sorted({*scopes, *backlog, *indexed}):
        path, waiting = scopes.get(scope), backlog.get(scope)
        core = path / "CORE.md" if path else None
        queued = "0" if waiting is None else (
            f"{waiting.queued}" + (f" ([red]{waiting.retrying} retrying: "
                                   f"{escape(one_line(waiting.last_error or '', 80))}[/])"
                                   if waiting.retrying else ""))
        where = escape(str(path)) if path else (
            "[dim]on the vault worker's host[/]" if scope in indexed else "[red]no vault yet[/]")
        git = ("yes" if (path / ".git").exists() else "[red]not a repository[/]") if path \
            else ""
        chars = str(len(core.read_text())) if core and core.exists() else "0" if path else ""
        table.add_row(escape(scope), where, chars, git, str(indexed.get(scope, 0)), queued)
    console.print(table)


def _indexed(settings: KeelSettings) -> dict[str, int]:
    """The scopes the index holds; none when no database is configured or running."""
    try:
        return indexed_scopes(database_url(settings))
    except (CliError, psycopg.Error):
        return {}


def _backlog(settings: KeelSettings) -> list[TranscriptBacklog]:
    """The transcript outbox per scope; none when no database is configured or running
    (the vaults are listed from their folders all the same)."""
    try:
        return transcript_backlog(database_url(settings))
    except (CliError, psycopg.Error):
        return []


async def _run_memory_workflow(settings: KeelSettings, workflow_run: Any, arg: Any,
                               wid: str) -> Any:
    keel = await connect(settings)
    with working(f"running {wid}…"):
        return await keel.client.execute_workflow(
            workflow_run, arg, id=f"{wid}{uuid.uuid4().hex[:8]}",
            task_queue=settings.vault_task_queue)


@vault_app.command("doctor")
def vault_doctor(scope: ScopeOption = "default") -> None:
    """Run the doctor now for one scope (a worker must be running)."""
    from schemas.vault.doctor import DoctorInput
    from workflows.doctor import DoctorWorkflow

    settings = load_settings()

    async def main() -> None:
        report = await _run_memory_workflow(
            settings, DoctorWorkflow.run, DoctorInput(scope=_existing_scope(settings, scope)),
            now_run_prefix(NightlyJob.DOCTOR, scope))
        console.print(escape(report.text()))

    run(main())


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

    settings = load_settings()
    rk = RollupKind(kind.value)
    # ROLLUP_WORKFLOWS holds the classes as plain `type`; each has its `run` method.
    workflow_run = cast(Any, ROLLUP_WORKFLOWS[rk]).run

    async def main() -> None:
        report = await _run_memory_workflow(
            settings, workflow_run, RollupInput(kind=rk, scope=_existing_scope(settings,
                                                                              scope)),
            now_run_prefix(NightlyJob(rk.value), scope))
        console.print(escape(report.text()))

    run(main())


@vault_app.command("search")
def vault_search(query: str, scope: ScopeOption = "default",
                 limit: Annotated[int, typer.Option(min=1, max=100, help="Most hits.")] = 5,
                 ) -> None:
    """Search one scope's long memory (BM25 + graph rerank), read from PostgreSQL."""
    settings = load_settings()

    async def main() -> None:
        if not query.strip():
            raise CliError("give words to search for: an empty query finds nothing")
        known = _existing_scope(settings, scope)
        try:
            hits = await search_memory(database_url(settings), query, scope=known, k=limit)
        except psycopg.Error as err:
            raise CliError(f"PostgreSQL: {err}") from None
        if note := hits.spelling_note():
            console.print(f"[dim]{escape(note)}[/]")
        if not hits:
            console.print(f"[dim]nothing in {escape(scope)}'s memory for "
                          f"{escape(one_line(query, 120))}[/]")
        for hit in hits:
            console.print(f"[cyan]{escape(hit.path)}[/] [dim]{hit.score:.3f}[/]  "
                          f"{escape(one_line(hit.snippet, 160))}")

    run(main())


@vault_app.command("show")
def vault_show(path: Annotated[str, typer.Argument(
        help="A path `keel vault search` gave: a card, a summary, a day's transcript "
        "(daily/DAY.md) or one message of it (daily/DAY.md#SESSION:SEQ).")],
               scope: ScopeOption = "default") -> None:
    """One document of a scope's long memory whole, read from PostgreSQL (what the agent's
    memory_get reads)."""
    from schemas.vault.rollup import without_markers

    settings = load_settings()

    async def main() -> None:
        try:
            found = await read_memory(database_url(settings), path,
                                      scope=_existing_scope(settings, scope))
        except psycopg.Error as err:
            raise CliError(f"PostgreSQL: {err}") from None
        if found is None:
            raise CliError(f"nothing at {one_line(path, 200)!r} in {scope}'s memory (take a "
                           "path keel vault search gave)")
        console.print(f"[cyan]{escape(found.path)}[/] [dim]{escape(found.kind)}"
                      f"{' · ' + escape(found.title) if found.title else ''}[/]")
        console.print(escape(without_markers(found.body)), soft_wrap=True)

    run(main())


@vault_app.command("forget")
def vault_forget(
    card: Annotated[str, typer.Argument(help="The card's title, or its vault path "
                                             "(cards/.../NAME.md).")],
    scope: ScopeOption = "default",
) -> None:
    """Forget one card: its file and index rows go, and the nightly rollup and memory
    flushes do not write it again from material of today or before (the agent's own
    write_card may). Says what still names it: transcripts, summaries, CORE.md."""
    from keel._errors import DeleteRefusedError
    from schemas.vault.forget import forgotten_text

    settings = load_settings()

    async def main() -> None:
        _check_scope(scope)
        keel = await connect(settings)
        try:
            with working(f"forgetting {one_line(card, 80)} in memory scope {scope}…"):
                done = await keel.forget_card(scope, card)
        except DeleteRefusedError as err:
            raise CliError(str(err)) from None
        for line in forgotten_text(done):
            console.print(escape(line))
        if done.path is None:
            raise typer.Exit(1)

    run(main())


@vault_app.command("erase")
def vault_erase(
    scope: Annotated[str, typer.Option("--scope", help="Whose memory to erase (a scope id).",
                                       show_default=False)],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask again.")] = False,
    with_sessions: Annotated[bool, typer.Option(
        "--with-sessions", help="Delete every session of the scope first (keel delete's "
        "way).")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="With --with-sessions: running sessions too, stopped first.")] = False,
) -> None:
    """Erase one scope's long memory whole: its vault folder (cards, daily notes, rollups,
    CORE.md and the git history holding every earlier version) and every row of its index
    and queues. Refused while a session of the scope runs."""
    import sys

    from keel._errors import DeleteRefusedError
    from schemas.vault.erase import erased_text

    settings = load_settings()

    async def main() -> None:
        _check_scope(scope)
        if not yes:
            what = f"memory scope {scope!r}" + (" and every session of it" if with_sessions
                                                else "")
            if not sys.stdin.isatty():
                raise CliError(f"erasing {what} cannot be undone: pass --yes to erase")
            if not typer.confirm(f"Erase {what}? It cannot be undone"):
                console.print("nothing erased")
                return
        keel = await connect(settings)
        try:
            with working(f"erasing memory scope {scope}…"):
                done = await keel.erase_memory_scope(scope, with_sessions=with_sessions,
                                                     force=force,
                                                     database_url=database_url(settings))
        except DeleteRefusedError as err:
            raise CliError(str(err)) from None
        console.print(escape(erased_text(done)))
        if not done.found:
            raise typer.Exit(1)

    run(main())
