"""The agent's own initiative on the command line: `keel wakeups SESSION` lists the
wakeups the agent scheduled, `--cancel ID` cancels one. A call on `keel.client` each."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from keel.cli.shell import run, session_handle
from keel.client import NotPendingError
from keel.console import console, error
from schemas.initiative import Wakeup

__all__ = ["wakeup_when", "wakeups"]


def wakeup_when(w: Wakeup) -> str:
    return (f"at {w.due.isoformat(timespec='seconds')}" if w.due else
            f"cron {w.cron}" if w.cron else f"every {w.every_s:g} s")


def wakeups(session: str,
            cancel: Annotated[str | None, typer.Option("--cancel",
                                                       help="Cancel this wakeup.")] = None,
            as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
            ) -> None:
    """The wakeups a session's agent scheduled (id, when, expiry, fires, note)."""
    async def main() -> None:
        handle = await session_handle(session)
        if cancel is not None:
            try:
                found = await handle.cancel_wakeup(cancel)
            except NotPendingError as err:
                error(str(err))
                raise typer.Exit(1) from None
            console.print(f"cancelled wakeup {escape(cancel)}")
        else:
            found = await handle.wakeups()
        if as_json:
            sys.stdout.write(json.dumps([w.model_dump(mode="json") for w in found]) + "\n")
            return
        if not found:
            console.print("[dim](no wakeups scheduled)[/]")
            return
        table = Table("id", "when", "expires", "fired", "note")
        for w in found:
            table.add_row(escape(w.id), wakeup_when(w), w.expires.isoformat(timespec="seconds"),
                          str(w.fired), escape(w.note))
        console.print(table)
    run(main())
