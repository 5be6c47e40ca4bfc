"""The state an imported session starts from (activities.bundle._own_state): its own ids,
nothing that runs elsewhere, and an ended run's copy going on. Pure: no server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from activities.bundle import _own_state
from schemas.initiative import ChildRun, DelegatedTask, Wakeup
from schemas.session import TOO_LONG_MESSAGE, SessionConfig, SessionState

NOW = datetime(2026, 12, 6, tzinfo=UTC)


def origin(**update: object) -> SessionState:
    child = ChildRun(session_id="s.researcher.c1", agent="researcher", call_id="c1",
                     started=NOW, deadline=NOW + timedelta(hours=1))
    state = SessionState(
        session_id="s", checkpoint_id="ckpt:s:a3",
        config=SessionConfig(delegated=DelegatedTask(parent_session="p", call_id="c0",
                                                     agent="a", task="t")),
        wakeups=[Wakeup(id="w1", note="poll", created=NOW, expires=NOW + timedelta(days=1),
                        every_s=60, schedule_id="keel-wakeup-s-w1")],
        children=[child, child.model_copy(update={"call_id": "c2", "done": "answered"})])
    return state.model_copy(update=update)


def test_an_import_s_state_is_its_own() -> None:
    state = _own_state(origin(), "s", "t")
    assert (state.session_id, state.checkpoint_id) == ("t", "ckpt:t:a3")
    assert [w.schedule_id for w in state.wakeups] == ["keel-wakeup-t-w1"]
    assert [c.call_id for c in state.children] == ["c2"]  # c1 still works: the origin's
    assert state.config.delegated is None


def test_an_ended_run_s_copy_goes_on_but_a_context_too_long_stays_stopped() -> None:
    ended = _own_state(origin(ended=True, stopped_reason="the session was ended on request"),
                       "s", "t")
    assert (ended.ended, ended.stopped_reason) == (False, None)
    full = _own_state(origin(ended=True, stopped_reason=TOO_LONG_MESSAGE), "s", "t")
    assert (full.ended, full.stopped_reason) == (False, TOO_LONG_MESSAGE)
    stopped = _own_state(origin(stopped_reason=TOO_LONG_MESSAGE), "s", "t")
    assert stopped.stopped_reason == TOO_LONG_MESSAGE
