"""The chat asks its person what a running turn waits on: a tool call's approval (the
session's or a sub-agent's under it) and a reached budget; the answer goes to the session
and the turn goes on, where the chat used to sit silent until another terminal answered.

Invariants: the session decides what waits and what an answer does (keel._approvals,
keel._control); this only finds what waits (the session's events wake it at once, a status
query every POLL_S finds the rest), asks once for each call or request, and sends the
answer, an approval bound to the input the person was shown. A line typed on a terminal
before a question showed is no answer to it: it is kept, and sent when the turn is over.
A question whose wait ends otherwise (answered elsewhere, its timeout, Ctrl-C's interrupt)
is withdrawn on a terminal and said to be over on a pipe, so the chat never waits on an
answer nobody needs.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import sys
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar

from rich.markup import escape

from keel._errors import (
    KeelError,
    MessageRejectedError,
    NoBudgetRequestError,
    NotPendingError,
    RecordFailedError,
    SessionStoppedError,
)
from keel.cli.shell import refusal_line
from keel.console import console, error
from keel.handle import SessionHandle
from schemas.agent import PendingApproval
from schemas.budget import BudgetRequest, as_much_again
from schemas.events import ApprovalDecided, BudgetAnswered, SessionEvent
from schemas.session import SessionStatus

__all__ = ["Asker", "Question", "questions_waiting"]

T = TypeVar("T")

ANSWER_PROMPT = "[bold]answer[/]: "
POLL_S = 1.0  # how soon a wait no event announced (a sub-agent's) is asked about
SHOWN_INPUT_CHARS = 300
YES = {"y", "yes"}
NO = {"n", "no"}
_PASTE_MARKS = re.compile(r"\x1b\[20[01]~")


@dataclass(frozen=True)
class Question:
    """One wait a person can end: `key` names it (its session's id / a call's or a budget
    request's id: the ids are a session's own)."""

    key: str
    prompt: str  # markup
    answer: Callable[[str], Awaitable[str]]  # the person's line (not a bare y/n) -> said


def questions_waiting(tree: list[tuple[SessionHandle, SessionStatus]], by: str
                      ) -> list[Question]:
    """What waits on a person in a session and the sub-agents under it (`tree_statuses`,
    the session first), in order: each one's calls, then its reached budget."""
    top = tree[0][0].session_id
    out: list[Question] = []
    for handle, status in tree:
        whose = "" if handle.session_id == top else f"sub-agent {escape(handle.session_id)}: "
        out += [_approval(handle, whose, p, by) for p in status.pending_approvals]
        if status.budget_request is not None:
            out.append(_budget(handle, whose, status.budget_request, by))
    return out


def _approval(handle: SessionHandle, whose: str, p: PendingApproval, by: str) -> Question:
    shown = json.dumps(p.input, ensure_ascii=False)
    if len(shown) > SHOWN_INPUT_CHARS:
        shown = shown[:SHOWN_INPUT_CHARS] + "…"

    async def answer(line: str) -> str:
        approve, note = line.split(maxsplit=1)[0].lower() in YES, _note(line)
        # Bound to the input shown: a call whose input differs is not decided by this.
        done = await handle.decide(p.call_id, approve, note, input_digest=p.input_digest,
                                   by=by)
        return f"{'approved' if approve else 'denied'} {done.tool} (call {done.call_id})"

    return Question(f"{handle.session_id}/{p.call_id}", (
        f"[yellow]{whose}approve[/] {escape(p.tool)} {escape(shown)}? "
        "[bold]y[/] / [bold]n[/] (a note for the model may follow the n)"), answer)


def _budget(handle: SessionHandle, whose: str, request: BudgetRequest, by: str
            ) -> Question:
    allowed = as_much_again(request)[1]

    async def answer(line: str) -> str:
        if line.split(maxsplit=1)[0].lower() in NO:
            await handle.refuse_budget(request_id=request.request_id, by=by, note=_note(line))
            return f"the {request.scope.value}'s budget not raised: the turn ends"
        await handle.raise_as_much_again(request, by=by, note=_note(line))
        return f"the {request.scope.value}'s budget raised: {allowed} more"

    return Question(f"{handle.session_id}/{request.request_id}", (
        f"[yellow]{whose}the {request.scope.value}'s budget is reached[/] "
        f"({escape('; '.join(request.reached))}): allow {escape(allowed)} more? "
        "[bold]y[/] / [bold]n[/] (the turn ends)"), answer)


def _note(line: str) -> str:
    parts = line.split(maxsplit=1)
    return parts[1].strip() if len(parts) > 1 else ""


class Asker:
    """Runs a turn's wait in the chat and asks the person what it waits on meanwhile."""

    def __init__(self, handle: SessionHandle, *, by: str,
                 set_prompt: Callable[[str | None], None]) -> None:
        self.handle = handle
        self.by = by
        self.set_prompt = set_prompt  # the view reprints it under an event shown meanwhile
        self.wake = asyncio.Event()
        self.asked: set[str] = set()
        self.up: str | None = None  # the key of the question the person sees now
        self.stdin_closed = False
        # Lines typed on the terminal before a question showed: messages, not its answer;
        # the chat sends them when the turn is over (`keel.cli.chat`).
        self.typed_ahead: list[str] = []

    def seen(self, event: SessionEvent) -> None:
        """An event about a wait on the person, before the view prints it: a new wait is
        looked at now; the question up is taken back when its wait was answered."""
        answered = (event.approval_id if isinstance(event, ApprovalDecided) else
                    event.request_id if isinstance(event, BudgetAnswered) else None)
        if answered is not None and f"{event.session_id}/{answered}" == self.up:
            self.withdraw()  # the event says who answered
        self.wake.set()

    async def _keep_typed_ahead(self) -> None:
        """Lines the person typed while the reply came were meant for the session, not for
        a question they had not seen: kept, and said so, before it is asked."""
        lines, ended = await lines_typed_ahead()
        for line in lines:
            console.print(f"[dim]kept for after this turn (typed before the question): "
                          f"{escape(line)}[/]")
        self.typed_ahead += lines
        self.stdin_closed = self.stdin_closed or ended

    def withdraw(self) -> None:
        """Take back the question up, if any (its wait was answered, or is being ended)."""
        if self.up is not None:
            self.up = None
            self.set_prompt(None)
            console.print()  # the answer's line ends
            self.wake.set()

    async def during(self, turn: Awaitable[T]) -> T | None:
        """`turn`'s result; meanwhile each wait on a person is asked about, once. None when
        the person's input ended while the turn waits on them (the chat leaves then; the
        session keeps waiting for an answer from elsewhere)."""
        task = asyncio.ensure_future(turn)
        try:
            while not task.done() and not self.stdin_closed:
                for question in await self._next(task):
                    if task.done():
                        break
                    await self._ask(question, task)
            return task.result() if task.done() else None
        finally:
            if not task.done():
                task.cancel()
                with suppress(asyncio.CancelledError, Exception):
                    await task

    async def ask_waiting(self) -> int:
        """Ask about each wait there is now (the chat's /pending, between turns): the turn
        that waits goes on on its own; how many were asked."""
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        questions = await self.waiting()
        for question in questions:
            if self.stdin_closed:
                break
            await self._ask(question, never)
        return len(questions)

    async def _next(self, turn: asyncio.Future[T]) -> list[Question]:
        """The waits not asked about yet, once an event or POLL_S says to look."""
        await self._nap(turn)
        if turn.done() or self.stdin_closed:
            return []
        return [q for q in await self.waiting() if q.key not in self.asked]

    async def _nap(self, *futures: asyncio.Future[Any]) -> None:
        """Until one of `futures` is done, an event wakes this (`seen`), or POLL_S passes."""
        woken = asyncio.ensure_future(self.wake.wait())
        try:
            await asyncio.wait({*futures, woken}, timeout=POLL_S,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            self.wake.clear()

    async def waiting(self) -> list[Question]:
        """What waits on a person now, in this session and the sub-agents under it."""
        try:
            tree = await self.handle.tree_statuses()
        except KeelError:  # the session ended meanwhile: the turn says so
            return []
        return questions_waiting(tree, self.by)

    async def _ask(self, question: Question, turn: asyncio.Future[T]) -> None:
        """Ask until an answer is taken, the wait ends, or input does: a line that is not
        y or n, or an answer the session refuses (a note over its bound), asks again."""
        self.asked.add(question.key)
        while (line := await self._answer_line(question, turn)) is not None:
            word = line.split(maxsplit=1)[0].lower() if line.strip() else ""
            if word not in YES | NO:
                console.print("[dim]y or n, please (that line was not sent to the "
                              "session)[/]")
                continue
            try:
                console.print(f"[dim]{escape(await question.answer(line))}[/]")
                return
            except (NotPendingError, NoBudgetRequestError):
                console.print("[dim]already answered elsewhere[/]")
                return
            except (SessionStoppedError, RecordFailedError) as err:  # not the answer's fault
                error(refusal_line(err))
                return
            except MessageRejectedError as err:  # the answer itself: say why, ask again
                error(refusal_line(err))
            except KeelError as err:
                error(refusal_line(err))
                return

    async def _answer_line(self, question: Question, turn: asyncio.Future[T]) -> str | None:
        """The person's line, or None when the wait ended before it (or input did)."""
        await self._keep_typed_ahead()
        if self.stdin_closed:
            return None
        console.print(question.prompt, highlight=False)
        self.up = question.key
        self.set_prompt(ANSWER_PROMPT)
        console.print(ANSWER_PROMPT, end="")
        reading = asyncio.ensure_future(read_line())
        try:
            # A pipe's line is read to its end even when the question was answered:
            # a thread reading on would take the chat's next line.
            while not reading.done() and (self.up is not None or not can_withdraw()):
                await self._nap(reading, turn)
                if reading.done() or self.up is None or not can_withdraw():
                    continue
                if turn.done() or question.key not in {q.key for q in await self.waiting()}:
                    console.print()
                    console.print("[dim]no longer waiting: the turn ended[/]")
                    return None
            if self.up is None:  # answered elsewhere (`seen` said so)
                return None
            line = reading.result()
        finally:
            self.up = None
            self.set_prompt(None)
            if not reading.done():
                reading.cancel()
                with suppress(asyncio.CancelledError):
                    await reading
        if line is None:  # end of input: the call stays pending for another terminal
            self.stdin_closed = True
            sid = escape(self.handle.session_id)
            console.print(f"[dim]no answer read; the turn waits (`keel pending {sid}`, "
                          f"`keel budget {sid}`)[/]")
        return line


async def lines_typed_ahead() -> tuple[list[str], bool]:
    """The whole lines a person typed on a terminal that nothing has read yet, and whether
    input ended after them. Elsewhere ([], False): a pipe's lines are read in order, each
    the answer its script meant."""
    fd = _tty_fd()
    lines: list[str] = []
    while fd is not None and select.select([fd], [], [], 0)[0]:
        line = await read_line()
        if line is None:
            return lines, True
        lines.append(line)
    return lines, False


def can_withdraw() -> bool:
    """A question can be taken back only where a line is read without a thread (a
    terminal, on a loop that watches file descriptors); a pipe's line is read to its end."""
    return _tty_fd() is not None


def _tty_fd() -> int | None:
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # a test runner's stream
        return None
    return fd if os.isatty(fd) and hasattr(asyncio.get_running_loop(), "add_reader") else None


async def read_line() -> str | None:
    """One line from the person, without its newline (None at end of input). On a terminal
    it is read from the descriptor as the loop sees it ready, so cancelling it leaves
    nothing behind; elsewhere, through `input()` in a thread."""
    fd = _tty_fd()
    if fd is None:
        return await _read_in_thread()
    loop = asyncio.get_running_loop()
    got: asyncio.Future[bytes] = loop.create_future()

    def ready() -> None:
        if not got.done():
            try:  # the terminal's line discipline hands over one line at a time
                got.set_result(os.read(fd, 4096))
            except OSError as err:
                got.set_exception(err)

    try:
        loop.add_reader(fd, ready)
    except NotImplementedError:  # a loop without it: read in a thread
        return await _read_in_thread()
    try:
        raw = await got
    finally:
        loop.remove_reader(fd)
    if not raw:
        return None
    return _PASTE_MARKS.sub("", raw.decode(errors="replace")).rstrip("\r\n")


async def _read_in_thread() -> str | None:
    try:
        return _PASTE_MARKS.sub("", await asyncio.to_thread(input))
    except EOFError:
        return None
