"""The interrupt policy's pure rules: a send's policy over the spec's over enqueue; an idle
session records whatever the policy; the marks an interrupted reply and a call not run get."""

from __future__ import annotations

from schemas.interrupt import (
    INTERRUPTED_MARK,
    BusyAction,
    InterruptPolicy,
    busy_action,
    choose_policy,
    interrupted_text,
    rejected_text,
)

P = InterruptPolicy


def test_the_send_wins_then_the_spec_then_enqueue():
    assert choose_policy(P.REJECT, P.INTERRUPT) is P.REJECT
    assert choose_policy(None, P.INTERRUPT) is P.INTERRUPT
    assert choose_policy(None, None) is P.ENQUEUE


def test_only_a_busy_session_interrupts_or_refuses():
    assert busy_action(P.INTERRUPT, busy=True) is BusyAction.INTERRUPT
    assert busy_action(P.REJECT, busy=True) is BusyAction.REFUSE
    assert busy_action(P.ENQUEUE, busy=True) is BusyAction.RECORD
    assert {busy_action(p, busy=False) for p in P} == {BusyAction.RECORD}


def test_marks():
    assert interrupted_text("Half a sent") == f"Half a sent\n\n{INTERRUPTED_MARK}"
    assert interrupted_text("  ") == INTERRUPTED_MARK
    assert "turn 3" in rejected_text(3) and "nothing was recorded" in rejected_text(3)
