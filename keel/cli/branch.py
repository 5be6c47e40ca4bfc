"""The commands on a session as a whole: fork, rewind, export, import, delete.

Invariants: each is a call on `keel.branching` or `keel.deletion` (through the client) and
a line saying what it did; the session and the record decide what is allowed (a refusal
arrives as `BranchRefusedError` or `DeleteRefusedError` and is printed as its one line).
Export, import and delete read and write the record's database: DATABASE_URL, else the
dev stack's. A deletion, which cannot be undone, is asked for once more unless --yes.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from keel import branching
from keel.cli.sessions import read_agent_spec
from keel.cli.shell import CliError, connect, database_url, load_settings, run
from keel.client import KeelClient, KeelError
from keel.console import console, error
from schemas.branch import live_wakeups

__all__ = ["delete", "export", "fork", "import_", "rewind", "seal_key"]


def fork(
    session: str,
    at: Annotated[int | None, typer.Option("--at", help="The seq to fork at.")] = None,
    checkpoint: Annotated[int | None, typer.Option(
        "--checkpoint", help="Fork right after this checkpoint (1: the first).")] = None,
    new_id: Annotated[str | None, typer.Option("--id", help="The new session's id.")] = None,
    request_id: Annotated[str | None, typer.Option(
        "--request-id", help="Make the fork once, however often asked with this id.")
                          ] = None,
) -> None:
    """A new session with the context SESSION had at a seq (its workspace as it was then);
    SESSION is untouched."""
    async def main() -> None:
        keel = await connect(load_settings())
        done = await keel.fork(session, at_seq=at, checkpoint=checkpoint, new_id=new_id,
                               request_id=request_id)
        files = f"{done.files_copied} file(s)" if done.workspace_versions else \
            "no files (the local workspace store keeps no versions)"
        console.print(f"forked [bold]{escape(done.session_id)}[/] from {escape(session)} at seq "
                      f"{done.at_seq}: {done.rows_copied} row(s), {files}")
    run(main())


def rewind(session: str,
           to: Annotated[int, typer.Option("--to", help="The seq to go on from.")]) -> None:
    """SESSION goes on from a seq: the rows after it are marked rewound (kept, never sent
    again), the workspace is restored to its versions there. Only while it is idle."""
    async def main() -> None:
        keel = await connect(load_settings())
        done = await keel.session(session).rewind(to)
        span = f" (#{done.first_rewound} to #{done.last_rewound})" if done.rows_rewound else ""
        console.print(f"rewound {escape(session)} to seq {done.to_seq}: {done.rows_rewound} row(s) "
                      f"marked rewound{span}, {done.files_restored} file(s) restored")
    run(main())


def export(session: str,
           output: Annotated[Path, typer.Option("--output", "-o", help="The bundle file.")],
           with_memory: Annotated[bool, typer.Option(
               "--with-memory", help="Include the cards the session wrote and its "
               "daily-note entries (a format version 2 bundle).")] = False,
           ) -> None:
    """Write SESSION's bundle: record, checkpoints, rewinds, workspace with its versions
    (and, with --with-memory, its cards and daily-note entries)."""
    async def main() -> None:
        settings = load_settings()
        keel = await connect(settings)
        data = await branching.export_session(keel, session, output,
                                              database_url=database_url(settings),
                                              with_memory=with_memory)
        console.print(f"exported {escape(session)} to {escape(str(output))} ({len(data):,} bytes)")
    run(main())


def import_(bundle: Path,
            new_id: Annotated[str | None, typer.Option(
                "--id", help="The session's id here (default: its id in the bundle).")
                              ] = None,
            trust: Annotated[bool, typer.Option(
                "--trust", help="Take a bundle this deployment did not seal (another "
                "deployment's, an older Keel's, a changed one) as its own: its agent's MCP "
                "servers and service tools, its long memory, and its harness inputs as "
                "they are.")] = False,
            agent: Annotated[Path | None, typer.Option(
                "--agent", help="Go on with this agent spec (a TOML or JSON file) instead "
                "of the bundle's.")] = None,
            without_memory: Annotated[bool, typer.Option(
                "--without-memory", help="Leave the bundle's cards and daily-note entries "
                "out.")] = False,
            memory_scope: Annotated[str | None, typer.Option(
                "--memory-scope", help="The long-memory scope it goes on in (default: the "
                "one the bundle names).")] = None,
            ) -> None:
    """Start the session a bundle holds in this deployment; it goes on where it was."""
    spec = read_agent_spec(agent)

    async def main() -> None:
        settings = load_settings()
        keel = await connect(settings)
        done = await branching.import_session(keel, bundle.read_bytes(), new_id,
                                              database_url=database_url(settings),
                                              trust=trust, agent=spec,
                                              with_memory=not without_memory,
                                              memory_scope=memory_scope)
        memory = f", {done.cards} card(s), {done.entries} daily-note entries" if (
            done.cards or done.entries) else ""
        console.print(f"imported [bold]{escape(done.session_id)}[/]: {done.rows} row(s), "
                      f"{done.checkpoints} checkpoint(s), {done.file_versions} file "
                      f"version(s){memory}")
        if done.forgotten_cards:
            console.print(f"{len(done.forgotten_cards)} card(s) left out, forgotten in "
                          f"this memory scope: {escape(', '.join(done.forgotten_cards))}")
        from schemas.bundle_seal import Seal, seal_said  # with the import (its crypto)

        said = f"the bundle was {seal_said(Seal(done.seal), done.sealed_by)}"
        if done.trusted:
            said += "; taken as this deployment's own (--trust)"
        elif done.unverified_inputs:
            said += (f"; its {done.unverified_inputs} harness input(s) are labelled as "
                     "imported unverified (--trust takes them as they are)")
        if agent is not None:
            said += f"; it goes on with the agent of {escape(str(agent))}"
        scope = done.state.config.memory_scope
        said += (f"; its long memory is scope {escape(repr(scope))}" if scope else
                 "; it has no long memory")
        if woken := live_wakeups(done.state, datetime.now(UTC)):
            said += (f"; its {len(woken)} wakeup(s) go on in it (keel wakeups "
                     f"{escape(done.session_id)})")
        console.print(said)
    run(main())


def seal_key() -> None:
    """Print this deployment's public key for bundle seals: another deployment that lists
    it in KEEL_TRUSTED_BUNDLE_KEYS (name=key) takes this one's bundles as its own."""
    async def main() -> None:
        settings = load_settings()
        keel = await connect(settings)
        key = await branching.seal_public_key(keel, database_url(settings))
        console.print(key, soft_wrap=True, highlight=False)
    run(main())


def delete(
    sessions: Annotated[list[str] | None, typer.Argument(
        help="The sessions to delete.", show_default=False)] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask again.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="A running session too: it is stopped first.")] = False,
    ended_before: Annotated[datetime | None, typer.Option(
        "--ended-before", formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S%z"],
        help="Every session that ended before this day (UTC) or time: a retention "
        "sweep.")] = None,
    memory_scope: Annotated[str | None, typer.Option(
        "--memory-scope", help="Take its daily-note entries out of this scope's vault even "
        "when its record is gone (a deletion whose vault did not answer).")] = None,
    with_sub_agents: Annotated[bool, typer.Option(
        "--with-sub-agents", help="Its sub-agents' sessions too (and theirs), first.")
                               ] = False,
) -> None:
    """Delete SESSIONS and all they own: record, checkpoints, workspace, wakeups,
    workflow histories and daily-note entries (--ended-before: every session that ended
    before then). The scope's cards and rollups stay, and sub-agents' sessions unless
    --with-sub-agents. A running session only with --force."""
    async def main() -> None:
        settings = load_settings()
        keel = await connect(settings)
        chosen = list(dict.fromkeys(sessions or []))
        if ended_before is not None:
            when = ended_before if ended_before.tzinfo else ended_before.replace(tzinfo=UTC)
            chosen += [s for s in await keel.sessions_ended_before(when) if s not in chosen]
            if not chosen:
                console.print(f"no session ended before {when.isoformat()}")
                return
        if not chosen:
            raise CliError("name the sessions to delete, or give --ended-before")
        named = ", ".join(chosen[:5]) + (f" and {len(chosen) - 5} more" if len(chosen) > 5
                                          else "")
        if not yes:
            if not sys.stdin.isatty():
                raise CliError(f"deleting {named} cannot be undone: pass --yes to delete")
            if not typer.confirm(f"Delete {named} and all they own? It cannot be undone"):
                console.print("nothing deleted")
                return
        if not await _delete_each(keel, chosen, database_url(settings), force=force,
                                  memory_scope=memory_scope, sub_agents=with_sub_agents):
            raise typer.Exit(1)
    run(main())


async def _delete_each(keel: KeelClient, chosen: list[str], url: str, *, force: bool,
                       memory_scope: str | None, sub_agents: bool) -> bool:
    """Each session deleted in turn, its lines printed; one refused is said and the rest
    go on. True when every one was deleted."""
    failed = 0
    for session in chosen:
        try:
            done = await keel.delete_session(session, force=force, database_url=url,
                                             memory_scope=memory_scope, sub_agents=sub_agents)
        except KeelError as err:
            if len(chosen) == 1:
                raise
            error(f"{session}: {err}")
            failed += 1
            continue
        for line in done.summary():
            console.print(escape(line))
    if failed:
        error(f"{failed} of {len(chosen)} sessions not deleted")
    return not failed
