"""A turn's error is printed once by the live view (keel.live.LiveView): the session emits
it as an error event and again on the turn's end."""

from __future__ import annotations

import io

from rich.console import Console

from keel.live import LiveView
from schemas.events import ErrorEvent, TurnEnded, TurnStarted
from schemas.session import TurnOutcome

AT = "2026-12-06T05:00:00Z"
FAILED = "The model call failed: ModelConnection: model API unreachable: Connection refused"


def _view() -> tuple[LiveView, io.StringIO]:
    out = io.StringIO()
    return LiveView(Console(file=out, width=200, color_system=None)), out


def test_a_turns_error_is_one_line_though_two_events_carry_it() -> None:
    view, out = _view()
    view.show(0, TurnStarted.model_validate({"session_id": "s", "at": AT, "turn": 1}))
    view.show(1, ErrorEvent.model_validate({"session_id": "s", "at": AT, "turn": 1,
                                            "message": FAILED, "where": "model"}))
    view.show(2, TurnEnded.model_validate({"session_id": "s", "at": AT, "turn": 1,
                                           "error": FAILED}))
    assert out.getvalue().count(FAILED) == 1


def test_the_same_error_in_another_turn_is_printed_again() -> None:
    view, out = _view()
    for turn in (1, 2):
        view.show(turn, TurnStarted.model_validate({"session_id": "s", "at": AT,
                                                    "turn": turn}))
        view.show(10 + turn, TurnEnded.model_validate({"session_id": "s", "at": AT,
                                                       "turn": turn, "error": FAILED}))
    assert out.getvalue().count(FAILED) == 2


def test_a_failed_attempt_is_said_and_the_turn_goes_on() -> None:
    view, out = _view()
    note = "the model API failed (attempt 1 of 12: Overloaded); asking again"
    view.show(0, TurnStarted.model_validate({"session_id": "s", "at": AT, "turn": 1}))
    view.show(1, ErrorEvent.model_validate({"session_id": "s", "at": AT, "turn": 1,
                                            "message": note, "where": "model_retrying"}))
    view.show(2, TurnEnded.model_validate({"session_id": "s", "at": AT, "turn": 1}))
    assert out.getvalue().count(note) == 1 and not view.errors_shown


def test_the_outcome_repeats_no_error_its_events_showed() -> None:
    """`keel send --wait` prints the outcome's error when the turn's end was not seen: the
    error event's (cut to its 500 characters) is the same error."""
    view, out = _view()
    long = FAILED + " (last attempt: " + "x" * 600 + ")"
    view.show(0, TurnStarted.model_validate({"session_id": "s", "at": AT, "turn": 1}))
    view.show(1, ErrorEvent.model_validate({"session_id": "s", "at": AT, "turn": 1,
                                            "message": long, "where": "model"}))
    view.show_outcome(TurnOutcome(turn=1, error=long))
    assert out.getvalue().count(FAILED) == 1


def test_a_wait_on_a_person_says_the_command_that_answers_it_with_the_session_s_id() -> None:
    """`keel tail` and `send --wait` cannot ask; the line names the session (the budget's
    said "SESSION"), and the chat's view, which asks, adds no command."""
    from keel.cli.waiting import ChatView
    from schemas.events import ApprovalNeeded, BudgetReached

    needed = ApprovalNeeded.model_validate({"session_id": "s-9", "at": AT, "turn": 1,
                                            "approval_id": "toolu_1", "tool": "deploy"})
    reached = BudgetReached.model_validate({"session_id": "s-9", "at": AT, "turn": 1,
                                            "request_id": "budget-1-1", "scope": "turn",
                                            "reached": "60 of 50 output tokens"})
    view, out = _view()
    view.show(0, needed)
    view.show(1, reached)
    said = " ".join(out.getvalue().split())
    assert "the turn waits: keel approve s-9 toolu_1, or keel deny" in said
    assert "the turn waits; keel budget s-9 --again, --raise AMOUNT or --refuse" in said
    chat_out = io.StringIO()
    chat = ChatView(Console(file=chat_out, width=200, color_system=None))
    chat.show(0, needed)
    chat.show(1, reached)
    shown = chat_out.getvalue()
    assert "approval needed toolu_1: deploy" in shown and "keel " not in shown
