"""The budget's pure rules: prices by model prefix, cost from usage (cache reads and writes
at their own prices), limits reached at or over, raises per scope, a turn's spend new each
turn, a child's share of what is left, and an answer that is one thing or the other."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas.agent import AgentSpec
from schemas.budget import (
    DEFAULT_PRICES,
    BudgetAnswer,
    BudgetLimits,
    BudgetRequest,
    BudgetScope,
    BudgetSpec,
    BudgetState,
    ModelPrice,
    Spend,
    against,
    as_much_again,
    child_share,
    cost_usd,
    price_for,
    raise_problem,
    reached,
    reply_price,
    spend_of,
    warning_notice,
)
from schemas.config import KeelSettings
from schemas.messages import Usage
from schemas.model import OFFLINE_MODEL_NAME


def test_price_is_the_longest_matching_prefix():
    assert price_for("claude-opus-4-5-20251101", DEFAULT_PRICES) == DEFAULT_PRICES[
        "claude-opus-4-5"]
    assert price_for("claude-opus-4-1-20250805", DEFAULT_PRICES).input == 15.0
    assert price_for("claude-sonnet-5", DEFAULT_PRICES).output == 15.0
    assert price_for("gpt-9", DEFAULT_PRICES) is None


def test_cost_counts_cache_reads_and_writes_at_their_prices():
    price = ModelPrice(input=3, output=15, cache_read=0.3, cache_write=3.75)
    usage = Usage(input_tokens=1_000, output_tokens=2_000, cache_read_input_tokens=10_000,
                  cache_creation_input_tokens=4_000)
    assert cost_usd(usage, price) == pytest.approx(
        (1_000 * 3 + 2_000 * 15 + 10_000 * 0.3 + 4_000 * 3.75) / 1e6)
    assert cost_usd(usage, None) == 0.0
    spend = spend_of(usage, 0.5)
    assert (spend.input_tokens, spend.cached_tokens, spend.output_tokens) == (5_000, 10_000,
                                                                                2_000)


def test_limits_are_reached_at_or_over_and_say_which():
    limits = BudgetLimits(usd=1.0, output_tokens=100)
    assert reached(Spend(usd=0.99, output_tokens=99), limits) == []
    assert reached(Spend(usd=1.0, output_tokens=150), limits) == [
        "$1.0000 of $1.0000", "150 of 100 output tokens"]
    assert reached(Spend(usd=99), None) == []


def test_raises_last_for_their_scope_and_a_turn_starts_afresh():
    spec = BudgetSpec(session=BudgetLimits(usd=1.0), turn=BudgetLimits(output_tokens=10))
    state = BudgetState()
    state.start_turn(1)
    state.charge(Spend(usd=0.5, output_tokens=12))
    assert state.check(spec) == (BudgetScope.TURN, ["12 of 10 output tokens"])
    state.grant(BudgetScope.TURN, BudgetLimits(output_tokens=10))
    assert state.check(spec) is None
    state.start_turn(2)  # the raise was for turn 1 only; turn 2 spends from nothing
    assert state.turn_spent == Spend() and state.check(spec) is None
    state.charge(Spend(usd=0.6))
    assert state.check(spec) == (BudgetScope.SESSION, ["$1.1000 of $1.0000"])
    state.grant(BudgetScope.SESSION, BudgetLimits(usd=1.0))
    assert state.limits(spec, BudgetScope.SESSION) == BudgetLimits(usd=2.0)
    assert state.check(spec) is None


def test_a_child_gets_a_share_of_what_is_left():
    share = child_share(BudgetLimits(usd=1.0, output_tokens=1_000),
                        Spend(usd=0.4, output_tokens=200), 0.5)
    assert share.usd == pytest.approx(0.3) and share.output_tokens == 400
    assert share.input_tokens is None
    assert child_share(None, Spend(), 0.5) == BudgetLimits()


def test_a_child_spec_gets_half_of_what_its_parent_has_left():
    from schemas.agent import child_spec
    from schemas.budget import CHILD_SHARE, child_budget
    from schemas.initiative import SubAgent

    parent = AgentSpec(budget=BudgetSpec(session=BudgetLimits(usd=1.0),
                                         turn=BudgetLimits(output_tokens=500)),
                       sub_agents=[SubAgent(name="r", instructions="look")])
    child = child_spec(parent, parent.sub_agents[0], 1, Spend(usd=0.2))
    assert child.budget is not None and child.budget.session is not None
    assert child.budget.session.usd == pytest.approx(0.8 * CHILD_SHARE)
    assert child.budget.turn == parent.budget.turn
    assert child_budget(None, Spend(usd=1)) is None
    assert child_spec(AgentSpec(sub_agents=parent.sub_agents), parent.sub_agents[0],
                      1).budget is None


def test_an_answer_raises_or_refuses_never_both_or_neither():
    assert BudgetAnswer(raise_by=BudgetLimits(usd=1)).problem() is None
    assert BudgetAnswer(refuse=True).problem() is None
    assert BudgetAnswer().problem() is not None
    assert BudgetAnswer(refuse=True, raise_by=BudgetLimits(usd=1)).problem() is not None


def test_the_spec_budget_is_strict():
    with pytest.raises(ValidationError, match="dollars"):
        AgentSpec.model_validate({"budget": {"session": {"dollars": 5}}})
    with pytest.raises(ValidationError):
        AgentSpec.model_validate({"budget": {"turn": {"usd": -1}}})
    assert AgentSpec.model_validate({"budget": {"session": {"usd": 5}}}).budget == BudgetSpec(
        session=BudgetLimits(usd=5))


def test_prices_come_from_defaults_and_keel_prices():
    settings = KeelSettings.from_env({"KEEL_PRICES": '{"my-model": {"input": 1, "output": 2,'
                                      ' "cache_read": 0.1, "cache_write": 1.25}}'})
    assert settings.prices["my-model"].output == 2
    assert settings.prices["claude-sonnet"] == DEFAULT_PRICES["claude-sonnet"]
    with pytest.raises(ValueError, match="KEEL_PRICES"):
        KeelSettings.from_env({"KEEL_PRICES": '{"m": {"input": 1}}'})


def _paused(state: BudgetState, spec: BudgetSpec) -> BudgetRequest:
    scope, said = state.check(spec) or (None, [])
    assert scope is not None, "the budget is not reached"
    return BudgetRequest(request_id="b1", scope=scope, reached=said, spent=state.turn_spent
                         if scope is BudgetScope.TURN else state.spent,
                         limits=state.limits(spec, scope) or BudgetLimits(), turn=1,
                         since=datetime(2026, 12, 6, tzinfo=UTC))


def test_as_much_again_lets_the_turn_spend_each_reached_limit_once_more():
    """The chat's "y" (keel.cli.asking): a limit overshot by a call is raised past the
    overshoot, so the turn goes on (a raise by the limit alone left it reached: 40 of 40)."""
    spec = BudgetSpec(turn=BudgetLimits(output_tokens=20, input_tokens=10_000))
    state = BudgetState()
    state.start_turn(1)
    state.charge(Spend(output_tokens=40, input_tokens=4_000))
    request = _paused(state, spec)
    raise_by, said = as_much_again(request)
    assert raise_by == BudgetLimits(output_tokens=40) and said == "20 output tokens"
    state.grant(request.scope, raise_by)
    assert state.check(spec) is None
    state.charge(Spend(output_tokens=19))
    assert state.check(spec) is None
    state.charge(Spend(output_tokens=1))
    assert state.check(spec) == (BudgetScope.TURN, ["60 of 60 output tokens"])


def test_as_much_again_is_at_least_a_cent_or_a_token():
    spec = BudgetSpec(session=BudgetLimits(usd=0.0, cached_tokens=0))
    state = BudgetState()
    request = _paused(state, spec)
    raise_by, said = as_much_again(request)
    assert raise_by == BudgetLimits(usd=0.01, cached_tokens=1)
    assert said == "$0.0100 and 1 cached tokens"
    state.grant(request.scope, raise_by)
    assert state.check(spec) is None


@given(limit=st.one_of(st.floats(0, 50, allow_nan=False), st.integers(0, 10**7)),
       over=st.floats(0, 1e6, allow_nan=False), usd=st.booleans())
def test_after_as_much_again_nothing_is_reached(limit, over, usd):
    name = "usd" if usd else "output_tokens"
    limit = float(limit) if usd else int(limit)
    spent = limit + (over if usd else int(over))
    spec = BudgetSpec(session=BudgetLimits(**{name: limit}))
    state = BudgetState(spent=Spend(**{name: spent}))
    request = _paused(state, spec)
    state.grant(request.scope, as_much_again(request)[0])
    assert state.check(spec) is None


def test_a_raise_must_raise_a_reached_limit_by_something():
    """A raise of a limit not in force started one of its size (a turn paused on output
    tokens "raised" by $1 got a $1 limit and stayed paused), and a raise of nothing ($0 from
    an empty form) started a $0 limit where none was, reached at once."""
    spec = BudgetSpec(turn=BudgetLimits(output_tokens=50, input_tokens=10**6))
    state = BudgetState()
    state.start_turn(1)
    state.charge(Spend(output_tokens=60, input_tokens=100))
    request = _paused(state, spec)
    assert raise_problem(request, BudgetLimits(usd=1.0)) == (
        "the turn's budget has no dollars limit to raise")
    assert raise_problem(request, BudgetLimits(output_tokens=0)) == (
        "a raise is of more than nothing (the output tokens by 0)")
    assert raise_problem(request, BudgetLimits(input_tokens=500)) == (
        "the raise leaves what was reached as it was (60 of 50 output tokens): raise that")
    assert raise_problem(request, BudgetLimits(output_tokens=5)) is None  # too small: taken
    assert raise_problem(request, BudgetLimits(output_tokens=5, input_tokens=5)) is None
    assert raise_problem(request, as_much_again(request)[0]) is None


def test_a_limit_is_said_near_once_at_its_share_and_again_once_a_raise_moved_it():
    spec = BudgetSpec(session=BudgetLimits(usd=1.0, output_tokens=1_000),
                      turn=BudgetLimits(input_tokens=100))
    state = BudgetState()
    state.start_turn(1)
    state.charge(Spend(usd=0.79, output_tokens=100, input_tokens=10))
    assert state.warnings(spec) == []  # under 80% of every limit
    state.charge(Spend(usd=0.01, input_tokens=70))
    said = state.warnings(spec)
    assert [(w.scope, w.limit, w.said) for w in said] == [
        (BudgetScope.SESSION, "usd", "$0.8000 of $1.0000"),
        (BudgetScope.TURN, "input_tokens", "80 of 100 input tokens")]
    assert state.warnings(spec) == []  # said once
    state.charge(Spend(usd=0.19, output_tokens=850))
    assert [(w.limit, w.said) for w in state.warnings(spec)] == [
        ("output_tokens", "950 of 1000 output tokens")]
    state.charge(Spend(usd=0.05))  # past the limit: the pause says it, not a warning
    assert state.warnings(spec) == []
    state.grant(BudgetScope.SESSION, BudgetLimits(usd=0.2))  # $1.20: $1.04 is near again
    assert [w.said for w in state.warnings(spec)] == ["$1.0400 of $1.2000"]
    state.start_turn(2)  # a new turn's limit is new: said again when it comes near
    state.charge(Spend(input_tokens=90))
    assert [(w.scope, w.limit) for w in state.warnings(spec)] == [
        (BudgetScope.TURN, "input_tokens")]
    assert BudgetState().warnings(BudgetSpec(session=BudgetLimits(usd=1.0), warn_at=None)) == []
    with pytest.raises(ValidationError):
        BudgetSpec(warn_at=1.5)
    assert warning_notice(said[0]) == (
        "The session's budget is 80% spent ($0.8000 of $1.0000); at the limit the turn "
        "pauses until a person raises it.")


def test_a_reply_is_priced_as_the_model_that_answered_and_the_offline_one_costs_nothing():
    table = {"claude-sonnet-4-5": ModelPrice(input=3, output=15, cache_read=0.3,
                                             cache_write=3.75),
             "my-alias": ModelPrice(input=1, output=2, cache_read=0.1, cache_write=1.25)}
    # A dated name under the alias asked for; an alias the table knows, answered by a
    # name it does not; Keel's offline model, whatever was asked for.
    assert reply_price("claude-sonnet-4-5-20250929", "claude-sonnet-4-5", table) \
        == table["claude-sonnet-4-5"]
    assert reply_price("some-model-20260101", "my-alias", table) == table["my-alias"]
    assert reply_price(None, "my-alias", table) == table["my-alias"]
    assert reply_price(OFFLINE_MODEL_NAME, "claude-sonnet-4-5", table) is None
    assert reply_price("keel-offline-rollup", "claude-sonnet-4-5", table) is None


def test_what_is_spent_of_each_limit_in_force_is_said():
    spent = Spend(usd=0.3001, output_tokens=950)
    assert against(spent, BudgetLimits(usd=0.35, output_tokens=1_000)) == [
        "$0.3001 of $0.3500, 86%", "950 of 1000 output tokens, 95%"]
    assert against(spent, BudgetLimits(usd=0.0)) == ["$0.3001 of $0.0000"]
    assert against(spent, None) == []
