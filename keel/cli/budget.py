"""The budget and interrupt commands: a session's spend and the request a reached budget
makes, the person's answer to it, and stopping a running turn.

Invariants: the session keeps the budget and decides what a raise does; these only show
its spend and send an answer (with who gave it: `--by`, else $USER) or a stop.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.markup import escape

from keel.cli.shell import CliError, run, session_handle
from keel.client import SessionHandle
from keel.console import console, error
from schemas.budget import Spend, against, as_much_again
from schemas.session import SessionStatus

__all__ = ["budget", "interrupt", "spend_line"]


def spend_line(spent: Spend) -> str:
    return spent.said()


def _show(status: SessionStatus) -> None:
    for what, spent, limits in (("session", status.spent, status.session_limits),
                                (f"turn {status.turn}", status.turn_spent, status.turn_limits)):
        of = against(spent, limits)
        console.print(f"{what} spent: {spend_line(spent)}"
                      + (f" (budget: {'; '.join(of)})" if of else ""))
    request = status.budget_request
    if request is None:
        console.print("[dim]no budget request is pending[/]")
        return
    console.print(f"[bold]paused[/]: the {request.scope.value}'s budget is reached "
                  f"({'; '.join(request.reached)}), request {request.request_id} since "
                  f"{request.since.isoformat(timespec='seconds')}")


def budget(
    session: str,
    raise_: Annotated[float | None, typer.Option(
        "--raise", min=0, help="Raise the reached budget by this many dollars.")] = None,
    output_tokens: Annotated[int | None, typer.Option(
        "--output-tokens", min=0, help="Raise its output-token limit by this many.")] = None,
    input_tokens: Annotated[int | None, typer.Option(
        "--input-tokens", min=0, help="Raise its input-token limit by this many.")] = None,
    cached_tokens: Annotated[int | None, typer.Option(
        "--cached-tokens", min=0, help="Raise its cached-token limit by this many.")] = None,
    again: Annotated[bool, typer.Option(
        "--again", help="Allow as much again of each limit reached (what `keel chat`'s y "
        "does).")] = False,
    refuse: Annotated[bool, typer.Option(
        "--refuse", help="Refuse a raise: the paused turn ends.")] = False,
    note: Annotated[str, typer.Option("--note", help="Said in the record.")] = "",
    by: Annotated[str, typer.Option("--by", help="Who answers.")] = "",
) -> None:
    """A session's spend and pending budget request; --raise AMOUNT, --again or --refuse
    answers it."""
    async def main() -> None:
        handle = await session_handle(session)
        who = by or os.environ.get("USER", "") or "user"
        raising = any(v is not None for v in (raise_, output_tokens, input_tokens,
                                              cached_tokens))
        if sum((refuse, raising, again)) > 1:
            error("one of --raise (an amount), --again or --refuse")
            raise typer.Exit(2)
        if refuse:
            status = await handle.refuse_budget(by=who, note=note)
        elif again:
            status = await _as_much_again(handle, by=who, note=note)
        elif raising:
            status = await handle.raise_budget(
                raise_, input_tokens=input_tokens, cached_tokens=cached_tokens,
                output_tokens=output_tokens, by=who, note=note)
        else:
            status = await handle.status()
        _show(status)
        if not (refuse or raising or again):
            await _sub_agents_paused(handle)
    run(main())


async def _as_much_again(handle: SessionHandle, *, by: str, note: str) -> SessionStatus:
    """The pending request's reached limits raised by as much again."""
    request = (await handle.status()).budget_request
    if request is None:
        raise CliError("no budget request is pending in this session")
    status = await handle.raise_as_much_again(request, by=by, note=note)
    console.print(f"allowed {as_much_again(request)[1]} more")
    return status


async def _sub_agents_paused(handle: SessionHandle) -> None:
    """A sub-agent paused on its budget holds its parent's turn: say which, and how to
    answer it (its own session's `keel budget`)."""
    for child, status in (await handle.tree_statuses())[1:]:
        request = status.budget_request
        if request is not None:
            sid = escape(child.session_id)
            console.print(f"[bold]sub-agent {sid} paused[/]: its {request.scope.value}'s "
                          f"budget is reached ({escape('; '.join(request.reached))}); "
                          f"keel budget {sid} --again, --raise AMOUNT or --refuse")


def interrupt(session: str) -> None:
    """Stop the running turn now: its model call is cancelled, what streamed is kept."""
    async def main() -> None:
        status = await (await session_handle(session)).interrupt()
        console.print(f"interrupt sent; the session is {status.phase.value}")
    run(main())
