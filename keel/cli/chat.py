"""`keel chat`: talk to a session at a prompt, its state a slash command away.

Invariants: one subscriber per session for the whole chat, so background inputs and the
replies to them show whenever they come; leaving the chat never ends the session; a refused
message or checkpoint is one error line and the chat goes on. Ctrl-C while a turn runs
interrupts the turn (the session's `interrupt`); at the prompt it leaves. A text pasted at
the prompt is one message, whatever its lines (the terminal's bracketed paste, read by GNU
readline), and so is one pasted while a reply streams (the terminal is kept marking pastes
then, and the next prompt reads it); as is a message typed with each line but the last
ending in a backslash. What a turn waits on a person for (a tool call's approval, the
sub-agents' too, a reached budget) is asked at once, in place (keel.cli.asking). Files
named by /attach go with the next message, put in the workspace only as it is sent; one
the session would refuse is refused as it is named, and the message is not sent.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from keel.cli.asking import Asker
from keel.cli.files import attachment_names, put_attachments
from keel.cli.sessions import (
    MemoryScopeOption,
    NoMemoryOption,
    compact_line,
    memory_config,
    scope_said,
    state_text,
    status_table,
)
from keel.cli.shell import CliError, connect, load_settings, refusal_line, run
from keel.cli.waiting import ChatView, chat_reader, needs_worker, say
from keel.client import (
    KeelClient,
    KeelError,
    MessageRejectedError,
    SessionExistsError,
    SessionHandle,
)
from keel.console import console, error
from schemas.session import SessionConfig, TurnOutcome

__all__ = ["CHAT_HELP", "chat"]

CHAT_HELP = ("/new starts a fresh session · /status /mind /memo /now show its state · "
             "/compact takes a checkpoint now · /pending asks what waits on you · "
             "/attach FILE sends a file (an image, a PDF, text) with your next message · "
             "a line ending in \\ goes on on the next · "
             "Ctrl-C while a reply comes interrupts the turn · /quit leaves (the session "
             "keeps running)")
CONTINUED = "\\"  # a line ending so goes on on the next: one message of several lines
# While this is on, a terminal marks a paste (readline turns it on as it reads a line, and
# off as it returns one).
PASTES_MARKED = "\x1b[?2004h"


def chat(session: Annotated[str | None, typer.Argument(
             help="Session to join or start (default: a new one).")] = None,
         id: Annotated[str | None, typer.Option("--id", help="The same, as an option.")]
         = None, memory_scope: MemoryScopeOption = None,
         no_memory: NoMemoryOption = False) -> None:
    """Talk to a session interactively."""
    async def main() -> None:
        marks_pastes = _line_editing()
        settings = load_settings()
        config = memory_config(settings, memory_scope, no_memory)
        talk = _Chat(await connect(settings), ChatView(console, whole_turns=True), config)
        await talk.open(session or id, help_after=True)
        try:
            while (text := await talk.prompt()) not in (None, "/quit", "/exit"):
                if text:
                    with _pastes_marked_meanwhile(marks_pastes):
                        await talk.dispatch(text)
        finally:
            talk.reader.cancel()
        console.print(f"[dim]left {escape(talk.handle.session_id)}; it keeps running.[/]")
    run(main())


def _line_editing() -> bool:
    """Line editing and history at the prompt, and a pasted text read whole (True: the
    terminal's marks of a paste are read).

    Importing `readline` gives `input()` (which the prompt reads with) GNU readline on a
    terminal. CPython turns readline's bracketed paste off; on, the terminal marks a paste
    and readline returns it as one line with its newlines, where a paste was read a line at
    a time, each line a message starting its own turn. Lines typed ahead are not marked, so
    they stay separate messages. libedit (macOS) and Windows have no such setting: there a
    paste stays line by line, and a backslash at a line's end still joins lines.
    """
    try:
        import readline
    except ImportError:  # Windows, or a Python built without it
        return False
    if "libedit" in (readline.__doc__ or ""):
        return False
    readline.parse_and_bind("set enable-bracketed-paste on")
    return True


@contextmanager
def _pastes_marked_meanwhile(marks_pastes: bool) -> Iterator[None]:
    """While a turn runs (off the prompt): the terminal goes on marking a paste, so a text
    pasted now reaches the next prompt whole, where readline reads its marks, not a line at
    a time, each line a message of its own; the marks the terminal echoes meanwhile are not
    shown as "^[[200~" (ECHOCTL off, put back before the prompt)."""
    if not (marks_pastes and sys.stdin.isatty() and sys.stdout.isatty()):
        yield
        return
    import termios

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    quiet = [*saved]
    quiet[3] = saved[3] & ~termios.ECHOCTL
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    sys.stdout.write(PASTES_MARKED)
    sys.stdout.flush()
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


class _Chat:
    """The chat's state: the session it talks to and that session's one reader."""

    handle: SessionHandle
    reader: asyncio.Task[None]

    def __init__(self, keel: KeelClient, view: ChatView,
                 config: SessionConfig | None = None) -> None:
        self.keel = keel
        self.view = view
        self.config = config  # a new session's (its memory scope), /new's too
        self.asker: Asker | None = None  # the running turn's
        self.typed_ahead: list[str] = []  # lines a question did not take: the next messages
        self.attached: list[Path] = []  # local files for the next message (/attach)

    async def open(self, session_id: str | None, *, help_after: bool = False) -> None:
        """Start the session (or join it, when it exists) and subscribe to its events."""
        config = self.config
        try:
            self.handle = await self.keel.start_session(session_id, config=config)
            console.print(f"[dim]started session[/] [bold]{escape(self.handle.session_id)}[/]"
                          f"[dim]{scope_said(config)}[/]")
        except SessionExistsError:
            assert session_id is not None
            self.handle = self.keel.session(session_id)
            console.print(f"[dim]joined session[/] [bold]{escape(session_id)}[/]" + (
                "[dim] (its memory scope was fixed at its start: --memory-scope and "
                "--no-memory are for a new session)[/]" if config is not None else ""))
        if help_after:
            console.print(f"[dim]{CHAT_HELP}[/]")
        self.reader = await chat_reader(self.handle, self.view)
        with suppress(KeelError):  # joined mid-turn: say what waits on the person
            if waits := len(await Asker(self.handle, by="", set_prompt=lambda _: None).waiting()):
                console.print(f"[yellow]the session waits on you[/] ({waits} question"
                              f"{'s' if waits > 1 else ''}): /pending asks")

    async def prompt(self) -> str | None:
        """The person's next message, stripped: a line, or several when each but the last
        ends in a backslash (dropped); None when they leave (end of input, Ctrl-C)."""
        lines: list[str] = []
        try:
            self.view.prompting = True
            line = await self._line("[bold]you[/]")
            while line.endswith(CONTINUED):
                lines.append(line[:-len(CONTINUED)])
                line = await self._line("[dim]...[/]")
        except (EOFError, KeyboardInterrupt):
            return None
        finally:
            self.view.prompting = False
        return "\n".join([*lines, line]).strip()

    async def _line(self, prompt: str) -> str:
        """A line typed while a turn ran (kept by its questions), shown at the prompt as if
        typed there, else the next one read. The prompt is printed here, on the event
        loop's thread, before the read begins on another: an event the view prints at the
        prompt (a checkpoint's line just after /compact) comes after it and shows it again,
        where the prompt printed by the reading thread came after the view's copy of it
        ("you: you: ")."""
        if self.typed_ahead:
            line = self.typed_ahead.pop(0)
            console.print(f"{prompt}: {escape(line)}")
            return line
        console.print(f"{prompt}: ", end="")
        return (await asyncio.to_thread(console.input)).strip()

    async def dispatch(self, text: str) -> None:
        """A slash command, or a message for the session (`//` starts a message)."""
        if text == "/new":
            self.reader.cancel()
            await self.open(None)
        elif text == "/status":
            console.print(status_table(await self.handle.status()))
        elif text == "/compact":
            try:
                console.print(await compact_line(self.handle))
            except MessageRejectedError as err:  # an ended session, say
                error(refusal_line(err))
        elif text in ("/mind", "/memo", "/now"):
            console.print(await state_text(self.handle, text[1:]))
        elif text == "/pending":
            await self._asking(None)
        elif text in ("/help", "/?"):
            console.print(f"[dim]{CHAT_HELP}[/]")
        elif text == "/attach" or text.startswith("/attach "):
            self.attach(text.removeprefix("/attach").strip())
        elif text.startswith("/") and not text.startswith("//"):
            console.print(f"[dim]unknown command; {CHAT_HELP}[/]")
        else:
            await self.send(text)

    def attach(self, named: str) -> None:
        """Local files (quoted as a shell would) for the next message; none named: the ones
        waiting are dropped."""
        if not named:
            console.print(f"[dim]{len(self.attached)} file(s) dropped[/]" if self.attached
                          else "[dim]/attach FILE: a file for your next message[/]")
            self.attached = []
            return
        try:
            files = [Path(word).expanduser() for word in shlex.split(named)]
            missing = next((f for f in files if not f.is_file()), None)
            if missing is not None:
                raise CliError(f"no file {missing}")
            attachment_names(self.keel.settings, [*self.attached, *files])
        except (CliError, ValueError) as err:  # a refusal, or unclosed quotes
            error(f"{err}; not attached")
            return
        self.attached += files
        console.print(f"[dim]with your next message: "
                      f"{', '.join(escape(f.name) for f in self.attached)}[/]")

    async def send(self, text: str) -> None:
        """The message, with the files /attach named (put in the workspace now)."""
        files: list[str] = []
        if self.attached:
            try:
                files = await put_attachments(self.keel.settings, self.handle.session_id,
                                              self.attached)
            except CliError as err:
                error(str(err))
                return
            self.attached = []
        await self._asking(say(self.handle, text, self.view, self.reader, attachments=files))

    async def _asking(self, turn: Coroutine[Any, Any, TurnOutcome] | None) -> None:
        """Wait for `turn`, asking the person what it waits on meanwhile (keel.cli.asking);
        None: ask about what waits now."""
        self.asker = Asker(self.handle, by=os.environ.get("USER", "") or "user",
                           set_prompt=self.view.asking)
        self.view.on_waiting = self.asker.seen
        try:
            with self._ctrl_c_interrupts():
                if turn is not None:
                    await needs_worker(self.handle, self.asker.during(turn))
                elif not await self.asker.ask_waiting():
                    console.print("[dim]nothing waits on you[/]")
        except MessageRejectedError as err:
            error(refusal_line(err))
        finally:
            self.typed_ahead += self.asker.typed_ahead
            self.asker, self.view.on_waiting = None, None

    @contextmanager
    def _ctrl_c_interrupts(self) -> Iterator[None]:
        """While a turn runs, Ctrl-C stops it (the session's interrupt) instead of leaving;
        at the prompt it leaves as before."""
        loop = asyncio.get_running_loop()
        stops: list[asyncio.Task[None]] = []

        def stop() -> None:
            if self.asker is not None:  # the interrupt denies the call it asks about
                self.asker.withdraw()
            console.print("[dim]interrupting the turn…[/]")
            stops.append(loop.create_task(self._interrupt()))
        try:
            loop.add_signal_handler(signal.SIGINT, stop)
        except (NotImplementedError, RuntimeError):  # not on this platform: Ctrl-C leaves
            yield
            return
        try:
            yield
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    async def _interrupt(self) -> None:
        try:
            await self.handle.interrupt()
        except MessageRejectedError as err:
            error(refusal_line(err))
