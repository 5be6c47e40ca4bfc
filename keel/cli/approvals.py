"""The approval commands: the tool calls that wait on a person, and the person's decision.

Invariants: the session decides what needs approval and what a decision does; these only
list its pending calls and send a decision, with who made it (`--by`, else $USER).
"""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from keel.cli.shell import run, session_handle
from keel.console import console

__all__ = ["approve", "deny", "pending"]


def pending(session: str,
            as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
            ) -> None:
    """Tool calls that wait on a person's approval: tool, input, since when (a sub-agent's
    too, with its session; `keel approve` on this session routes the decision to it)."""
    async def main() -> None:
        tree = await (await session_handle(session)).tree_pending()
        if as_json:
            console.print_json(json.dumps([
                c.model_dump(mode="json") | ({} if sid == session else {"session_id": sid})
                for sid, c in tree]))
            return
        if not tree:
            console.print("[dim]no call waits on approval[/]")
            return
        children = any(sid != session for sid, _ in tree)
        table = Table("call id", "tool", "input", "since", *(["session"] if children else []))
        for sid, c in tree:
            table.add_row(escape(c.call_id), escape(c.tool), escape(json.dumps(c.input)[:200]),
                          c.since.isoformat(timespec="seconds"),
                          *([escape(sid) if sid != session else ""] if children else []))
        console.print(table)
    run(main())


def approve(session: str, call_id: str,
            by: Annotated[str, typer.Option("--by", help="Who approves.")] = "",
            ) -> None:
    """Approve a pending tool call; the turn goes on and the call runs."""
    async def main() -> None:
        done = await (await session_handle(session)).approve(
            call_id, by=by or os.environ.get("USER", ""))
        console.print(f"approved {escape(done.tool)} (call {escape(done.call_id)})")
    run(main())


def deny(session: str, call_id: str,
         note: Annotated[str, typer.Option("--note", help="What the model is told.")] = "",
         by: Annotated[str, typer.Option("--by", help="Who denies.")] = "",
         ) -> None:
    """Deny a pending tool call; the note is the error result the model gets."""
    async def main() -> None:
        done = await (await session_handle(session)).deny(
            call_id, note, by=by or os.environ.get("USER", ""))
        console.print(f"denied {escape(done.tool)} (call {escape(done.call_id)})")
    run(main())
