"""What the command line shows a person scanning a list (keel.console): a time as the
clock time today or the date before, with how long ago; and no character of a session's
text that a terminal would act on, only its picture."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st
from rich.table import Table

from keel.console import KeelConsole, ago, visible

ACTED_ON = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F),
                             *range(0x2066, 0x206A)) if chr(c) not in "\t\n"]

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


def test_every_character_a_terminal_acts_on_is_shown_not_sent() -> None:
    for ch in ACTED_ON:
        shown = visible(f"a{ch}b")
        assert shown.startswith("a") and shown.endswith("b") and len(shown) > 2, repr(ch)
        assert not any(c in shown for c in ACTED_ON), repr(shown)
    assert visible("\x1b[2J\x1b]52;c;SGk=\x1b\\") == "␛[2J␛]52;c;SGk=␛\\"
    assert visible("one\r\ntwo\rthree\ttab\n") == "one\ntwo␍three\ttab\n"
    assert visible("invoice\u202egnp.exe") == "invoice<U+202E>gnp.exe"


@given(st.text(st.characters(blacklist_categories=["Cc", "Cf", "Cs"]) | st.sampled_from(
    ["\n", "\t", "\u200d", "\u200f"])))
def test_text_a_terminal_only_prints_is_unchanged(text: str) -> None:
    # Letters of every script, emoji (with their joiners), marks, spaces; right-to-left
    # text keeps its own marks: only embeddings, overrides and isolates are shown.
    assert visible(text) == text


def test_the_console_renders_strings_and_table_cells_visible() -> None:
    out = KeelConsole(file=io.StringIO(), force_terminal=False, width=80)
    table = Table("text")
    table.add_row("cell\x1b[31m red")
    out.print("line\x1b]0;title\x07 end", table)
    printed = out.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b" not in printed and "\x07" not in printed
    assert "line␛]0;title␇ end" in printed and "cell␛[31m red" in printed
