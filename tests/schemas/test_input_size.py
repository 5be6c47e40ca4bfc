"""The input limits (schemas.input_size): one rule for a user's message (refused over them)
and a background input (recorded cut, kept whole): what is over, and that a cut input with
its line is within both limits whatever the text and the reason given."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.agent import AgentSpec
from schemas.input_size import (
    CUT_REASON_CHARS,
    InputLimits,
    LargestPart,
    agent_tokens,
    config_fit_problem,
    cut_line,
    fit_mcp_tools,
    input_limits,
    kept_prefix,
    over_limits,
    room_taken,
)
from schemas.mcp import McpTool
from schemas.messages import MessageType
from schemas.model import TooLong
from schemas.session import SessionConfig
from schemas.tokens import count_tokens


def test_the_limits_are_the_characters_and_half_the_hard_limit() -> None:
    assert input_limits(200_000, 171_000) == InputLimits(chars=200_000, tokens=85_500)
    limits = InputLimits(chars=1_000, tokens=50)
    assert over_limits("word " * 40, limits) is None
    assert over_limits("x" * 1_001, limits) == "1001 characters; the limit is 1000"
    many = "alpha beta gamma delta " * 20  # 460 characters, ~80 tokens
    assert over_limits(many, limits) == (
        f"{count_tokens(many)} tokens; on this model one may have at most 50")


def test_a_cut_names_its_counts_and_a_long_reason_is_cut_too() -> None:
    assert cut_line(10, 99, "the whole input is in .keel/inputs/seq-3-ab.txt") == (
        "\n[Keel: input cut at 10 of 99 characters; "
        "the whole input is in .keel/inputs/seq-3-ab.txt]")
    long = cut_line(1, 2, "the rest could not be kept (" + "why " * 200 + ")")
    assert len(long) < CUT_REASON_CHARS + 60 and long.endswith("…]")


@settings(max_examples=200, deadline=None)
@given(text=st.text(min_size=0, max_size=6_000),
       chars=st.integers(min_value=450, max_value=5_000),
       tokens=st.integers(min_value=150, max_value=2_000),
       reason=st.one_of(st.text(max_size=60), st.text(min_size=300, max_size=600)))
def test_a_cut_input_with_its_line_is_within_both_limits(text: str, chars: int, tokens: int,
                                                         reason: str) -> None:
    limits = InputLimits(chars=chars, tokens=tokens)
    kept = kept_prefix(text, limits)
    assert text.startswith(kept)
    recorded = kept + cut_line(len(kept), len(text), reason)
    assert over_limits(recorded, limits) is None, (len(recorded), count_tokens(recorded))


def test_an_agent_may_add_a_quarter_of_the_hard_limit_to_every_request() -> None:
    small, big = SessionConfig(context_window=10_000), SessionConfig(context_window=200_000)
    long = AgentSpec(instructions="Check the release notes twice. " * 1_500)  # 46,500 chars
    assert agent_tokens(AgentSpec()) < agent_tokens(long)
    assert config_fit_problem(SessionConfig(context_window=16_000)) is None  # no agent
    assert config_fit_problem(big.with_agent(long)) is None
    problem = config_fit_problem(small.with_agent(long))
    limit = small.window().hard_limit // 4
    assert problem == (
        f"the agent's instructions and tool definitions take {agent_tokens(long)} tokens "
        f"with Keel's system prompt; a session with a window of 10000 tokens may give them "
        f"at most {limit}, to leave room for the conversation: shorten them, or give the "
        "session a larger window")


def test_a_window_must_leave_room_for_keels_own_prompt_and_a_request() -> None:
    # Without an agent, Keel's own prompt and built-in tools take a quarter at most too.
    own = agent_tokens(None)
    assert 0 < own < agent_tokens(AgentSpec(instructions="Be brief."))
    tight = SessionConfig(context_window=10_000)  # a hard limit of 1,808: a quarter is 452
    assert config_fit_problem(tight) == (
        f"Keel's system prompt and built-in tool definitions take {own} tokens; a session "
        "with a window of 10000 tokens may give them at most 452, to leave room for the "
        "conversation: give the session a larger window")
    smallest = 4 * own + tight.max_output_tokens
    assert config_fit_problem(SessionConfig(context_window=smallest)) is None
    assert config_fit_problem(SessionConfig(context_window=smallest - 4)) is not None
    # A full reply that takes the whole window leaves a request nothing, agent or not.
    for agent in (None, AgentSpec()):
        config = SessionConfig(context_window=8_000, max_output_tokens=8_192, agent=agent)
        assert config_fit_problem(config) == (
            "a reply of up to 8192 tokens leaves nothing of a window of 8000 tokens for the "
            "request: give the session a larger window or a smaller max_output_tokens")


def test_mcp_tools_are_kept_in_order_while_they_fit_the_agents_share() -> None:
    tools = [McpTool(name=f"mcp__s__t{i}", server="s", original_name=f"t{i}",
                     description="Looks one record up by its key. " * 10) for i in range(80)]
    spec, hard_limit = AgentSpec(), 12_000
    kept, left = fit_mcp_tools(spec, tools, hard_limit)
    assert kept == tools[:len(kept)] and left == [t.name for t in tools[len(kept):]]
    assert 0 < len(kept) < len(tools)
    kept_tokens = sum(count_tokens(json.dumps(t.to_anthropic(), ensure_ascii=False))
                      for t in kept)
    assert agent_tokens(spec) + kept_tokens <= hard_limit // 4
    assert fit_mcp_tools(spec, tools, 200_000) == (tools, [])


def test_a_stop_says_what_the_request_takes() -> None:
    assert room_taken(12_345, 11_488, 2_100) == (
        "The next request: about 12,345 tokens of the 11,488 one may have; about 2,100 of "
        "them are what every request carries (Keel's system prompt with the agent's "
        "instructions and AGENTS.md files, and the tool definitions).")
    refused = TooLong(prompt_tokens=7_430, maximum=6_000, estimate=12_345)
    assert room_taken(12_345, 11_488, 2_100, refused).startswith(
        "The next request: the API counted 7,430 tokens against its 6,000; about 2,100 ")
    largest = LargestPart(seq=42, type=MessageType.TOOL_RESULT, tokens=8_250)
    assert room_taken(12_345, 11_488, 2_100, refused, largest).endswith(
        "and the tool definitions). The largest of the rest is #42, a tool's result: about "
        "8,250 tokens.")
