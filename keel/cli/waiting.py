"""Waiting on a session from a terminal: a turn shown as it happens, and a wait that says
when no worker serves the session instead of hanging.

Invariants: nothing here decides anything about a session; it sends through
`keel.client`, shows through `keel.live`, and gives up only on a wait no worker can end.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Sequence
from contextlib import suppress
from typing import Any, TypeVar

from temporalio.service import RPCError, RPCStatusCode

from keel.cli.shell import CliError
from keel.client import SessionHandle
from keel.console import console
from keel.events import EventsMissed
from keel.live import LiveView
from schemas.events import (
    ApprovalDecided,
    ApprovalNeeded,
    BudgetAnswered,
    BudgetReached,
    SessionEvent,
)
from schemas.session import TurnOutcome

__all__ = ["ChatView", "chat_reader", "follow", "needs_worker", "say"]

T = TypeVar("T")

# A command that waits on a session says, after this long, when no worker polls its queue.
NO_WORKER_AFTER_S = float(os.environ.get("KEEL_NO_WORKER_AFTER_S", "10"))
CATCH_UP_S = 3.0  # how long a finished turn's events may trail its outcome
YOU = "[bold]you[/]: "  # the chat's prompt


async def needs_worker(handle: SessionHandle, call: Coroutine[Any, Any, T]) -> T:
    """Run `call` (which a worker must serve); if it is still waiting after
    NO_WORKER_AFTER_S and no worker polls the session's task queue, stop and say so."""
    task = asyncio.ensure_future(call)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=NO_WORKER_AFTER_S)
            if done:
                try:
                    return task.result()
                except RPCError as err:
                    # A query fails at once when the server has seen no poller lately, or
                    # times out when the one it saw has gone.
                    if err.status not in (RPCStatusCode.FAILED_PRECONDITION,
                                          RPCStatusCode.CANCELLED,
                                          RPCStatusCode.DEADLINE_EXCEEDED):
                        raise
                    queue = await handle.queue_without_worker()
                    if queue is None:
                        raise
                    raise _no_worker(queue, handle.session_id) from err
            queue = await handle.queue_without_worker()
            if queue is not None:
                raise _no_worker(queue, handle.session_id)
    finally:
        if not task.done():
            task.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await task


def _no_worker(queue: str, session_id: str) -> CliError:
    return CliError(
        f"no worker polls the task queue {queue!r}: start one with `keel dev` (everything on "
        "this machine) or `keel worker` (TEMPORAL_ADDRESS and DATABASE_URL set); what was "
        f"sent may still be taken when one starts (see `keel record {session_id}`)")


async def follow(handle: SessionHandle, after: int, view: LiveView) -> None:
    async for offset, event in handle.events(after=after):
        view.show(offset, event)


async def say(handle: SessionHandle, text: str, view: LiveView,
              reader: asyncio.Task[None] | None = None, *,
              attachments: Sequence[str] = ()) -> TurnOutcome:
    """Send `text` (with the workspace files `attachments`) and show the turn that answers
    it as it happens, through `reader` (the chat's one subscriber) or a reader of its own
    from the stream's current offset. A refused message raises (`MessageRejectedError`),
    with nothing recorded."""
    if reader is not None:  # the chat: one update records the message, returns the outcome
        outcome = await handle.ask(text, attachments=attachments)
        await _show_outcome(view, outcome, reader)
        return outcome
    after = await handle.event_offset()
    own = asyncio.create_task(follow(handle, after, view))
    try:  # `send --wait`: the seq first, then what the session does with it
        view.pause()
        try:
            accepted = await handle.send(text, attachments=attachments)
            console.print(f"seq {accepted.seq}")
        finally:
            view.resume()
        outcome = await handle.wait_reply(accepted.seq)
        await _show_outcome(view, outcome, own)
        return outcome
    finally:
        own.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await own


async def _show_outcome(view: LiveView, outcome: TurnOutcome, reader: asyncio.Task[None]
                        ) -> None:
    """The turn's end, once its events have been shown (or after CATCH_UP_S)."""
    with suppress(TimeoutError):
        async with asyncio.timeout(CATCH_UP_S):
            while not view.outcome_shown(outcome) and not reader.done():
                await asyncio.sleep(0.02)
    view.show_outcome(outcome)


class ChatView(LiveView):
    """The chat's view: an event that arrives while the person is at a prompt is printed
    above it, and the prompt is shown again; an event about a wait on the person (an
    approval, a reached budget, either answered) goes first to `on_waiting`
    (keel.cli.asking asks them, and takes a question back once it is answered)."""

    prompting = False
    prompt = YOU
    on_waiting: Callable[[SessionEvent], None] | None = None

    def _line(self, markup: str) -> None:
        if self.prompting and not self.mid_line:
            self.console.print()
            super()._line(markup)
            self.console.print(self.prompt, end="")
            return
        super()._line(markup)

    def _text(self, reply_seq: int, text: str) -> None:
        if self.prompting and not self.mid_line:  # off the prompt's line; it comes back
            self.console.print()                # after the reply's (`_line`)
        super()._text(reply_seq, text)

    def asking(self, prompt: str | None) -> None:
        """A question's prompt is up (None: back to none)."""
        self.prompting, self.prompt = prompt is not None, prompt or YOU

    # The chat asks (keel.cli.asking) during its turn; between turns (a background input's)
    # it says /pending does. No command to copy either way.
    def _approve_hint(self, e: ApprovalNeeded) -> str:
        return self._pending_hint()

    def _budget_hint(self, e: BudgetReached) -> str:
        return self._pending_hint()

    def _pending_hint(self) -> str:
        return ("[dim]: /pending asks what waits on you[/]"
                if self.prompting and self.prompt == YOU else "")

    def show(self, offset: int, event: SessionEvent | EventsMissed) -> None:
        if (self.on_waiting is not None and not self.paused and isinstance(
                event, ApprovalNeeded | ApprovalDecided | BudgetReached | BudgetAnswered)):
            self.on_waiting(event)
        super().show(offset, event)


async def chat_reader(handle: SessionHandle, view: LiveView) -> asyncio.Task[None]:
    """The chat's one subscriber to a session, from what happens next."""
    after = await needs_worker(handle, handle.event_offset())
    return asyncio.create_task(follow(handle, after, view))
