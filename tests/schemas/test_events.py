"""The stream's pure rules (schemas.events): how a reply's tail becomes text deltas, and
when the stream counts as read. No server."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from schemas.events import (
    DELTA_CHARS,
    READER_LAG,
    DeltaTail,
    StreamWatchers,
    TextDelta,
    tail_deltas,
)

AT = datetime(2026, 12, 6, tzinfo=UTC)


@given(st.text(max_size=3 * DELTA_CHARS + 7), st.integers(0, 5), st.integers(0, 50))
def test_a_tail_is_its_text_in_pieces_that_fit_a_delta(text: str, index: int,
                                                        start: int) -> None:
    pieces = tail_deltas(DeltaTail(attempt=2, index=index, start=start, text=text[:DELTA_CHARS]),
                         "ignored: the tail has its own text")
    assert "".join(p for _, _, p in pieces) == text[:DELTA_CHARS]
    assert [i for i, _, _ in pieces] == list(range(index, index + len(pieces)))
    # Each piece is a TextDelta as it stands: none is cut by the event's bound.
    for i, at, piece in pieces:
        assert TextDelta(session_id="s", at=AT, index=i, start=at, text=piece).text == piece


@given(st.text(max_size=3 * DELTA_CHARS + 7))
def test_a_whole_tail_publishes_the_replys_text_from_the_start(reply: str) -> None:
    pieces = tail_deltas(DeltaTail(attempt=1, whole=True), reply)
    assert "".join(p for _, _, p in pieces) == reply
    assert all(TextDelta(session_id="s", at=AT, text=p).text == p for _, _, p in pieces)
    assert [at for _, at, _ in pieces] == [sum(len(p) for _, _, p in pieces[:k])
                                           for k in range(len(pieces))]


def test_an_empty_tail_publishes_nothing() -> None:
    assert tail_deltas(DeltaTail(), "a reply") == []
    assert tail_deltas(DeltaTail(whole=True), "") == []


def test_the_stream_is_read_by_a_waiting_poll_a_recent_one_or_new_polls() -> None:
    assert not StreamWatchers().reading()  # nobody ever polled
    assert StreamWatchers(waiting=1, polls=1, latest=0, offset=90).reading()
    # A reader re-polling as each event lands asked from near the newest one.
    assert StreamWatchers(polls=7, latest=40, offset=40 + READER_LAG).reading()
    # One that stopped reading long ago did not...
    assert not StreamWatchers(polls=7, latest=40, offset=41 + READER_LAG).reading()
    # ...unless it polled since the last look (a reader by query arriving mid-reply).
    assert StreamWatchers(polls=8, latest=0, offset=90).reading(polls_before=7)
    assert not StreamWatchers(polls=7, latest=0, offset=90).reading(polls_before=7)
    seen = StreamWatchers(offset=50)
    seen.saw(45)
    seen.saw(3)  # a reader from the start: the furthest asked stays
    assert (seen.polls, seen.latest) == (2, 45) and seen.reading()
