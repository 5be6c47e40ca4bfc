"""Rich output helpers shared by the `keel` command line and the demo.

Invariants: these only render. Errors go to stderr, escaped, on one line; a spinner shows
only on a terminal (a pipe or a test gets no animation and no control codes); a database
URL is printed without its password.
- No text a session holds reaches the terminal as a control sequence: a Watch's text, a
  tool's result, a web page an MCP server read, a reply can all carry ESC (colours, a
  cleared screen, a title, OSC 52 writing the clipboard), a lone carriage return (a line
  overwritten) or a bidi override (text shown reordered). Every string these consoles
  render passes `schemas.text.visible` first, which shows such characters (␛, ␍,
  <U+202E>) instead of sending them; Keel's own styling is rich's, added after.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from schemas.text import visible


class KeelConsole(Console):
    """A rich Console whose strings pass `visible` before markup is read."""

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(visible(text), **options)


console = KeelConsole(highlight=False)
err_console = KeelConsole(stderr=True, highlight=False)


@contextmanager
def working(text: str, out: Console | None = None) -> Iterator[None]:
    """A spinner for anything that may take more than a second."""
    target = out or console
    if not target.is_terminal:  # a pipe or a test: no animation, no stray control codes
        yield
        return
    with target.status(text, spinner="dots"):
        yield


def error(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def one_line(text: str, width: int | None = None) -> str:
    """Collapse whitespace and cut to the terminal width, for one-line replies."""
    flat = " ".join(text.split())
    limit = width or max(40, shutil.get_terminal_size((120, 20)).columns - 16)
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def key_values(rows: list[tuple[str, object]], title: str | None = None) -> Table:
    table = Table(show_header=False, box=None, title=title, title_justify="left",
                  pad_edge=False)
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for key, value in rows:
        table.add_row(key, escape("" if value is None else str(value)))
    return table


def redact_url(url: str) -> str:
    """A database URL without its password, for printing."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def ago(when: str, now: datetime) -> str:
    """An ISO time as a person scans a list: the local clock time (today) or the date and
    time, and how long ago; the text as given when it is no time."""
    try:
        moment = datetime.fromisoformat(when)
    except ValueError:
        return when
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    local, seconds = moment.astimezone(now.tzinfo), (now - moment).total_seconds()
    shown = (local.strftime("%H:%M:%S") if local.date() == now.date()
             else local.strftime("%Y-%m-%d %H:%M"))
    if seconds < 0:
        return shown
    for unit, size in (("day", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{shown} ({n} {unit}{'s' if unit == 'day' and n > 1 else ''} ago)"
    return f"{shown} (just now)"
