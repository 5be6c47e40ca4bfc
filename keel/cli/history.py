"""The commands that look back at a session: its record, its replay, its live events.

Invariants: `record` reads PostgreSQL only through `keel.record` (no SQL here) and needs no
running workflow; `replay` runs the workflow code on a fetched or saved history, with the
worker's own converter, and never talks to a worker; `tail` only shows events.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from keel.cli.shell import (
    CliError,
    connect,
    database_url,
    fail,
    load_settings,
    run,
    session_handle,
)
from keel.cli.waiting import needs_worker
from keel.console import console, error, one_line, working
from keel.live import LiveView, event_dict
from keel.record import MAX_PAGE, RecordEntry, read_session_page

__all__ = ["record", "replay", "tail"]


def record(
    session: str,
    user: Annotated[bool, typer.Option("--user", help="Only the user's own messages.")] = False,
    from_seq: Annotated[int, typer.Option("--from", help="First seq.")] = 1,
    limit: Annotated[int, typer.Option(min=1, max=MAX_PAGE, help="Most rows.")] = 200,
    full: Annotated[bool, typer.Option("--full", help="Whole texts, not one line.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a row.")] = False,
) -> None:
    """The conversation of record, read from PostgreSQL: seq, type, source line, text."""
    settings = load_settings()
    try:
        rows = read_session_page(database_url(settings), session, from_seq=from_seq,
                                 user_only=user, limit=limit)
    except Exception as err:
        fail(err)
    if rows is None:
        error(f"no session {session!r} in the record: is the session id right?")
        raise typer.Exit(1)
    if as_json:
        for row in rows:
            line = {"seq": row.seq, "type": row.type, "source_line": row.source_line,
                    "text": row.text, "tokens": row.token_count, "turn": row.turn}
            if row.rewound_by:  # a rewind abandoned it (keel rewind)
                line["rewound_by"] = row.rewound_by
            if row.origin_session:  # a fork copied it
                line["origin"] = {"session": row.origin_session, "seq": row.origin_seq}
            if row.files:  # sent with a user's message (described; the bytes stay)
                line["attachments"] = row.files
            sys.stdout.write(json.dumps(line) + "\n")
        return
    if not rows:
        console.print(f"[dim]no messages for {escape(session)} from seq {from_seq}[/]")
        return
    _print_rows(rows, full)


def _print_rows(rows: list[RecordEntry], full: bool) -> None:
    # Plain aligned lines rather than a table: a table squeezes the text column to
    # nothing on a narrow terminal or a pipe, and these rows are mostly text.
    console.print(f"[dim]{'seq':>5}  {'type':<11} {'tokens':>6}  source line / text[/]")
    for row in rows:
        body = row.shown_text if full else one_line(row.shown_text, 160)
        source = f"[yellow]{escape(row.source_line)}[/] " if row.source_line else ""
        if row.rewound_by:  # kept, never sent again: the abandoned branch
            source = "[red](rewound)[/] " + source
        console.print(f"{row.seq:>5}  [cyan]{row.type:<11}[/] [dim]{row.token_count:>6}[/]  "
                      f"{source}{escape(body)}", soft_wrap=not full)


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
            histories = await _fetch_histories(session, run_id, save)
        return await _replay_all(session, histories)
    if not run(main()):
        raise typer.Exit(1)


async def _fetch_histories(session: str, run_id: str | None, save: Path | None
                           ) -> list[WorkflowHistory]:
    keel = await connect(load_settings())
    with working("Fetching the history…"):
        histories = await keel.histories(session, run_id)
        if not histories:
            raise CliError(f"not found: no session {session}")
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        for n, history in enumerate(histories, 1):
            path = save / f"{session}-run{n}.json"
            path.write_text(history.to_json())
            console.print(f"saved run {n} to {escape(str(path))}")
    return histories


def _replay_workflows() -> list[type]:
    from workflows.session import SessionWorkflow

    try:  # the long-memory workflows, where that part is installed
        from workers.worker import MEMORY_WORKFLOWS
    except ImportError:
        return [SessionWorkflow]
    return [SessionWorkflow, *MEMORY_WORKFLOWS]


async def _replay_all(session: str, histories: list[WorkflowHistory]) -> bool:
    """Replay each history, saying how each went; True when all replay deterministically."""
    from schemas.tokens import warm_tokenizer
    from workers.payload_refs import worker_converter

    warm_tokenizer()  # as a worker does: the workflow counts tokens
    # The worker's own converter: a foreign payload reference replays as it ran.
    replayer = Replayer(workflows=_replay_workflows(),
                        data_converter=worker_converter(pydantic_data_converter))
    ok = True
    for history in histories:
        if not history.events:
            raise CliError(f"the history of {session} is empty")
        ok = await _replay_one(replayer, session, history) and ok
    return ok


async def _replay_one(replayer: Replayer, session: str, history: WorkflowHistory) -> bool:
    events = len(history.events)
    cont = any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
               for e in history.events)
    with working(f"Replaying {events} events…"):
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    run_id = history.run_id
    if result.replay_failure is None:
        console.print(f"[bold green]✓ {escape(session)} (run {escape(run_id)}) replays "
                      "deterministically[/]"
                      f" ({events} events{', ended in continue-as-new' if cont else ''})")
        return True
    console.print(f"[bold red]✗ {escape(session)} (run {escape(run_id)}) does not replay "
                  f"deterministically[/]")
    console.print(escape(f"{type(result.replay_failure).__name__}: "
                         f"{result.replay_failure}"))
    return False


def tail(
    session: str,
    from_: Annotated[int | None, typer.Option(
        "--from", min=0,
        help="First offset to show (default: only what happens from now).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object a line.")] = False,
) -> None:
    """Follow a session's events: inputs, streamed replies, tool calls, checkpoints, errors.
    Ends when the session ends; Ctrl-C leaves."""
    async def main() -> None:
        handle = await session_handle(session)
        newest = await needs_worker(handle, handle.event_offset())
        after = from_ if from_ is not None else newest
        if after > newest:  # said (on stderr: --json stays JSON), so a mistyped offset
            # is not taken for a quiet session
            print(f"offset {after} is past the session's next event ({newest}): waiting "
                  "for it", file=sys.stderr, flush=True)
        view = LiveView(console)
        async for offset, event in handle.events(after=after):
            if as_json:
                sys.stdout.write(json.dumps(event_dict(offset, event)) + "\n")
                sys.stdout.flush()
            else:
                view.show(offset, event)
    run(main())
