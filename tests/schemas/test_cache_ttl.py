"""How long a session's prompt-cache entries live (schemas.cache_ttl), how a request marks
them (schemas.context.with_cache_breakpoints) and what an hour's write costs
(schemas.budget): pure rules, no server."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from activities.offline.blocks import prompt_blocks
from schemas.agent import spec_from_text
from schemas.budget import DEFAULT_PRICES, cost_usd
from schemas.cache_ttl import (
    RECENT_GAPS,
    CacheTtl,
    cache_ttl,
    lifetime_refused,
    remember_gap,
    remember_written,
    short_lived,
)
from schemas.context import with_cache_breakpoints
from schemas.messages import Usage
from schemas.session import SessionConfig
from tests.fake_anthropic.rules import check_cache_control

MIN = 60.0


def test_auto_asks_for_an_hour_once_a_quarter_of_the_gaps_outlast_five_minutes() -> None:
    assert cache_ttl(CacheTtl.AUTO, []) is CacheTtl.SHORT  # nothing seen yet
    assert cache_ttl(CacheTtl.AUTO, [20, 40, 15]) is CacheTtl.SHORT  # a busy session
    assert cache_ttl(CacheTtl.AUTO, [12 * MIN]) is CacheTtl.LONG
    assert cache_ttl(CacheTtl.AUTO, [30, 30, 30, 20 * MIN]) is CacheTtl.LONG  # 1 in 4
    assert cache_ttl(CacheTtl.AUTO, [30, 30, 30, 30, 20 * MIN]) is CacheTtl.SHORT
    # Gaps over an hour outlast an hour's entry too: they do not call for it.
    assert cache_ttl(CacheTtl.AUTO, [3 * 3600, 5 * 3600]) is CacheTtl.SHORT
    assert cache_ttl(CacheTtl.AUTO, [5 * MIN]) is CacheTtl.SHORT  # read in time
    # Only the recent gaps count: a session that got busy goes back to five minutes.
    old_habit = [20 * MIN] * 4 + [10.0] * RECENT_GAPS
    assert cache_ttl(CacheTtl.AUTO, old_habit) is CacheTtl.SHORT


def test_measured_it_asks_for_an_hour_when_the_hour_costs_less() -> None:
    """A person's bursts of work (short gaps) and breaks (one in eight over five minutes):
    the break's rewrite of a 100k context outweighs 0.75x of a 5k turn's writes eight
    times over, so the hour; a small context whose turns write much keeps five minutes."""
    bursts = [10.0] * 7 + [20 * MIN]
    assert cache_ttl(CacheTtl.AUTO, bursts) is CacheTtl.SHORT  # unmeasured: a quarter
    assert cache_ttl(CacheTtl.AUTO, bursts, 100_000, [5_000] * 8) is CacheTtl.LONG
    assert cache_ttl(CacheTtl.AUTO, bursts, 10_000, [20_000] * 8) is CacheTtl.SHORT
    # A turn that wrote the whole context again after a break is not a usual turn.
    rewrote = [5_000] * 7 + [100_000]
    assert cache_ttl(CacheTtl.AUTO, bursts, 100_000, rewrote) is CacheTtl.LONG
    # No gap an hour bridges and five minutes do not: five minutes, whatever the sizes.
    assert cache_ttl(CacheTtl.AUTO, [10.0] * 8, 100_000, [10] * 8) is CacheTtl.SHORT
    assert cache_ttl(CacheTtl.AUTO, [2 * 3600.0] * 8, 10**6, [10] * 8) is CacheTtl.SHORT


@given(st.lists(st.floats(0, 10 * 3600), max_size=20))
def test_a_fixed_lifetime_is_kept_whatever_the_gaps(gaps: list[float]) -> None:
    assert cache_ttl(CacheTtl.SHORT, gaps) is CacheTtl.SHORT
    assert cache_ttl(CacheTtl.LONG, gaps) is CacheTtl.LONG


def test_only_a_usual_calls_writes_are_remembered() -> None:
    """A session's first call and a call after a wait past five minutes write the whole
    context: not what a call usually writes."""
    written = remember_written([], 4_000, None)  # the first call
    written = remember_written(written, 4_100, 20 * MIN)  # after a wait: a rewrite
    assert written == []
    assert remember_written(written, 150, 2.0) == [150]
    assert remember_written([10] * RECENT_GAPS, 150, 2.0) == [10] * (RECENT_GAPS - 1) + [150]


@given(st.lists(st.floats(-10, 10 * 3600), max_size=30))
def test_the_gaps_remembered_are_the_last_few(gaps: list[float]) -> None:
    kept: list[float] = []
    for gap in gaps:
        kept = remember_gap(kept, gap)
    assert len(kept) == min(len(gaps), RECENT_GAPS)
    assert all(g >= 0 for g in kept)


def _conversation() -> list[dict]:
    return [{"role": "user", "content": "the recollection"},
            {"role": "assistant", "content": "noted"},
            {"role": "user", "content": [{"type": "text", "text": "the newest input"},
                                         {"type": "text", "text": "<memory-context>"}]}]


def test_an_hours_breakpoints_are_all_an_hour_and_the_api_takes_their_order() -> None:
    system, messages = with_cache_breakpoints(
        "sys", _conversation(), checkpoint_text="the recollection",
        volatile_text="<memory-context>", turn_boundary=2, ttl="1h")
    body = {"model": "claude-sonnet-5", "max_tokens": 10, "system": system,
            "messages": messages}
    controls = [b.cache_control for b in prompt_blocks(body) if b.cache_control is not None]
    assert len(controls) == 4
    assert controls == [{"type": "ephemeral", "ttl": "1h"}] * 4
    assert check_cache_control(body) is None
    # Five minutes, the default, is not written out: the bytes Keel always sent.
    short_system, short = with_cache_breakpoints(
        "sys", _conversation(), checkpoint_text="the recollection",
        volatile_text="<memory-context>", turn_boundary=2)
    assert with_cache_breakpoints(
        "sys", _conversation(), checkpoint_text="the recollection",
        volatile_text="<memory-context>", turn_boundary=2, ttl="5m") == (short_system, short)
    assert "ttl" not in str(short_system) + str(short)


def test_an_hours_cache_write_costs_twice_the_input() -> None:
    price = DEFAULT_PRICES["claude-sonnet"]  # $3 input, $3.75 a 5-minute write
    short = Usage(cache_creation_input_tokens=1_000_000)
    hour = Usage(cache_creation_input_tokens=1_000_000,
                 cache_creation_1h_input_tokens=1_000_000)
    mixed = Usage(cache_creation_input_tokens=1_000_000,
                  cache_creation_1h_input_tokens=400_000)
    assert (cost_usd(short, price), cost_usd(hour, price)) == (3.75, 6.0)
    assert round(cost_usd(mixed, price), 6) == round(0.6 * 3.75 + 0.4 * 6.0, 6)
    assert cost_usd(hour, price.model_copy(update={"cache_write_1h": 5.0})) == 5.0


def test_an_agent_spec_may_fix_the_lifetime_and_one_that_says_nothing_keeps_it() -> None:
    spec = spec_from_text('instructions = "You watch a release."\nprompt_cache_ttl = "1h"\n',
                          ".toml")
    config = SessionConfig().with_agent(spec)
    assert config.prompt_cache_ttl is CacheTtl.LONG
    assert config.with_agent(spec.model_copy(update={"prompt_cache_ttl": None})
                             ).prompt_cache_ttl is CacheTtl.LONG  # as a model left unset
    assert SessionConfig().with_agent(None).prompt_cache_ttl is CacheTtl.AUTO


def test_a_request_asked_again_with_the_default_lifetime() -> None:
    system, messages = with_cache_breakpoints("sys", _conversation(), ttl="1h")
    request = {"model": "m", "max_tokens": 10, "system": system, "messages": messages,
               "tools": [{"name": "t", "input_schema": {"type": "object"}}]}
    again = short_lived(request)
    system5, messages5 = with_cache_breakpoints("sys", _conversation())
    assert again == {**request, "system": system5, "messages": messages5}
    assert "ttl" in str(request) and "ttl" not in str(again)  # the request given unchanged
    order = ("messages.4.content.0.cache_control.ttl: a ttl='1h' cache_control block must"
             " not come after a ttl='5m' cache_control block.")
    assert lifetime_refused("ModelHTTP400", f"model API answered 400: {order}", "1h")
    assert not lifetime_refused("ModelHTTP400", order, "5m")  # it asked for no hour
    assert not lifetime_refused("ModelHTTP400", "messages: roles must alternate", "1h")
    assert not lifetime_refused("ModelHTTP529", "overloaded ttl", "1h")
