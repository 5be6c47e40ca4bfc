"""The fallback model's rules, without a server: which attempt asks it, whose it is (the
agent's, else the worker's), what a reader is told, and that a spec never carries a secret
in its name."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.agent import BUILTIN_TOOL_NAMES, AgentSpec, fallback_model, spec_problems
from schemas.config import KeelSettings
from schemas.model import FALLBACK_FROM_ATTEMPT, model_for_attempt, retry_note


def test_the_third_attempt_on_asks_the_fallback() -> None:
    assert FALLBACK_FROM_ATTEMPT == 3
    asked = [model_for_attempt("m", "f", n) for n in range(1, 6)]
    assert asked == ["m", "m", "f", "f", "f"]
    assert [model_for_attempt("m", None, n) for n in (1, 3, 12)] == ["m"] * 3
    assert model_for_attempt("m", "f", 1, held=True) == "f"
    assert model_for_attempt("m", None, 1, held=True) == "m"


def test_the_agent_s_fallback_wins_over_the_worker_s() -> None:
    assert fallback_model(AgentSpec(fallback_model="a"), "w") == "a"
    assert fallback_model(AgentSpec(), "w") == "w"
    assert fallback_model(None, "w") == "w" and fallback_model(None, None) is None
    assert KeelSettings.from_env({"KEEL_FALLBACK_MODEL": "claude-x"}).model.fallback_model \
        == "claude-x"
    assert KeelSettings.from_env({}).model.fallback_model is None
    assert KeelSettings.from_env({}).model.fallback_hold_s == 60.0
    assert KeelSettings.from_env({"KEEL_FALLBACK_HOLD_S": "5"}).model.fallback_hold_s == 5.0


def test_the_reader_is_told_when_the_next_attempt_turns_to_the_fallback() -> None:
    assert retry_note(2, "Overloaded", 12, "f") == (
        "the model API failed (attempt 2 of 12: Overloaded); asking f instead")
    assert retry_note(3, "Overloaded", 12) == (
        "the model API failed (attempt 3 of 12: Overloaded); asking again")
    assert retry_note(12, "Overloaded", 12, "f") is None


def test_a_fallback_s_name_is_checked_as_a_model_s() -> None:
    problems = spec_problems(AgentSpec(fallback_model="sk-live0123456789abcdefghijklmnop"),
                             BUILTIN_TOOL_NAMES)
    assert any(p.startswith("fallback_model: ") for p in problems), problems
    with pytest.raises(ValidationError):
        AgentSpec(fallback_model="")
    with pytest.raises(ValidationError):
        AgentSpec(fallback_model="m" * 257)
