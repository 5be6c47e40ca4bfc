"""What the command line shows a person scanning a list (keel.console): a time as the
clock time today or the date before, with how long ago; and a session's text shown, never
acted on (schemas.text.visible, tested in tests/test_text_rules.py), in every string and
table cell the console renders."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta, timezone

from rich.table import Table

from keel.console import KeelConsole, ago

NOW = datetime(2026, 12, 6, 9, 30, tzinfo=UTC)


def test_a_time_today_shows_the_clock_and_how_long_ago() -> None:
    assert ago("2026-12-06T09:29:58+00:00", NOW) == "09:29:58 (just now)"
    assert ago("2026-12-06T09:27:05+00:00", NOW) == "09:27:05 (2 min ago)"
    assert ago("2026-12-06T02:10:00+00:00", NOW) == "02:10:00 (7 h ago)"


def test_an_earlier_day_shows_the_date_and_days() -> None:
    assert ago("2026-12-05T09:00:00+00:00", NOW) == "2026-12-05 09:00 (1 day ago)"
    assert ago("2026-11-26T09:00:00+00:00", NOW) == "2026-11-26 09:00 (10 days ago)"


def test_local_time_naive_future_and_no_time() -> None:
    tokyo = NOW.astimezone(timezone(timedelta(hours=9)))
    assert ago("2026-12-06T09:27:05+00:00", tokyo) == "18:27:05 (2 min ago)"
    assert ago("2026-12-06T09:27:05", NOW) == "09:27:05 (2 min ago)"  # taken as UTC
    assert ago("2026-12-06T09:31:00+00:00", NOW) == "09:31:00"  # another clock ahead
    assert ago("", NOW) == "" and ago("soon", NOW) == "soon"


def test_the_console_renders_strings_and_table_cells_visible() -> None:
    out = KeelConsole(file=io.StringIO(), force_terminal=False, width=80)
    table = Table("text")
    table.add_row("cell\x1b[31m red")
    out.print("line\x1b]0;title\x07 end", table)
    printed = out.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b" not in printed and "\x07" not in printed
    assert "line␛]0;title␇ end" in printed and "cell␛[31m red" in printed
