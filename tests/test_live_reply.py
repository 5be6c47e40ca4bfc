"""A reply is printed once by the live view (keel.live.LiveView) whatever its length: the
stream brings it, the turn's end carries its first PREVIEW_CHARS (cut with a mark past
them), the caller's outcome the whole; each mends only what the person has not seen."""

from __future__ import annotations

import io

from rich.console import Console

from keel.live import LiveView
from schemas.events import CUT_MARK, PREVIEW_CHARS, TextDelta, TurnEnded, TurnStarted
from schemas.session import TurnOutcome

AT = "2026-12-07T22:00:00Z"
REPLY = " ".join(f"word{i}" for i in range(300))  # past the turn end's preview


def _view() -> tuple[LiveView, io.StringIO]:
    out = io.StringIO()
    return LiveView(Console(file=out, width=100_000, color_system=None)), out


def _turn(view: LiveView, streamed: str) -> None:
    view.show(0, TurnStarted.model_validate({"session_id": "s", "at": AT, "turn": 1}))
    for i in range(0, len(streamed), 200):
        view.show(1 + i, TextDelta.model_validate({"session_id": "s", "at": AT, "turn": 1,
                                                  "reply_seq": 2, "index": i // 200,
                                                  "start": i, "text": streamed[i:i + 200]}))
    view.show(10_000, TurnEnded.model_validate({
        "session_id": "s", "at": AT, "turn": 1, "reply_seq": 2, "reply_chars": len(REPLY),
        "reply_preview": REPLY}))


def test_a_long_reply_streamed_whole_is_printed_once() -> None:
    assert len(REPLY) > PREVIEW_CHARS
    view, out = _view()
    _turn(view, REPLY)
    view.show_outcome(TurnOutcome(turn=1, reply_seq=2, reply_text=REPLY,
                                  reply_chars=len(REPLY)))
    printed = out.getvalue()
    assert printed.count("word299") == 1 and printed.count("word0 ") == 1, printed
    assert "differs" not in printed and "whole reply" not in printed
    assert f"keel: {REPLY}\n" in printed


def test_a_stream_that_stopped_early_is_mended_from_the_preview_then_the_outcome() -> None:
    """Deltas lost after the first 200 characters: the turn's end brings the view to its
    preview (and a cut mark: more follows), the outcome shows the whole reply once more."""
    view, out = _view()
    _turn(view, REPLY[:200])
    printed = out.getvalue()
    assert f"keel: {REPLY[:PREVIEW_CHARS - len(CUT_MARK)]}{CUT_MARK}\n" in printed
    view.show_outcome(TurnOutcome(turn=1, reply_seq=2, reply_text=REPLY,
                                  reply_chars=len(REPLY)))
    assert out.getvalue().count("word299") == 1
    assert out.getvalue().endswith(f"(the whole reply:)\nkeel: {REPLY}\n")


def test_an_outcome_finishes_a_reply_whose_turn_end_was_not_seen() -> None:
    view, out = _view()
    view.show(0, TurnStarted.model_validate({"session_id": "s", "at": AT, "turn": 1}))
    view.show(1, TextDelta.model_validate({"session_id": "s", "at": AT, "turn": 1,
                                           "reply_seq": 2, "text": REPLY[:300]}))
    view.show_outcome(TurnOutcome(turn=1, reply_seq=2, reply_text=REPLY,
                                  reply_chars=len(REPLY)))
    assert out.getvalue() == f"keel: {REPLY}\n"
