"""The API's count and refusals as Keel reads them: pure rules, no server."""

from __future__ import annotations

import pytest

from activities.offline.accounting import (
    TOOL_PROMPT_TOKENS,
    Accounting,
    context_problem,
    too_long_message,
)
from schemas.checkpoint.memo import memo_candidates
from schemas.checkpoint.policy import (
    MIN_ROUND_REPLY,
    RATIO_MAX,
    RATIO_MIN,
    estimate_margin,
    learned_ratio,
    results_room,
    round_reply_room,
)
from schemas.messages import MessageType, RecordRow
from schemas.model import TooLong, too_long
from schemas.tokens import count_tokens

BODY = {"model": "m", "max_tokens": 10, "system": "You are terse.",
        "messages": [{"role": "user", "content": "hello there"}]}
TOOL = {"name": "read_file", "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}


@pytest.mark.parametrize(("message", "expected"), [
    ("prompt is too long: 16136 tokens > 16000 maximum", TooLong(prompt_tokens=16136,
                                                                 maximum=16000)),
    ("input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease"
     " input length or `max_tokens` and try again",
     TooLong(prompt_tokens=188240, maximum=200000 - 21333)),
    ("prompt is too long", TooLong()),
])
def test_a_too_long_refusal_is_read_with_the_apis_numbers(message: str,
                                                           expected: TooLong) -> None:
    assert too_long(400, message) == expected


def test_other_refusals_are_not_too_long() -> None:
    assert too_long(400, "messages.1: tool_use ids must be unique") is None
    assert too_long(500, "prompt is too long: 5 tokens > 4 maximum") is None


def test_a_refusal_without_numbers_counts_just_past_the_limit() -> None:
    assert TooLong().counted(hard_limit=9_000) == 9_001
    assert TooLong(maximum=8_000).counted(hard_limit=9_000) == 8_001
    assert TooLong(prompt_tokens=12_345).counted(hard_limit=9_000) == 12_345


def test_the_ratio_follows_the_apis_count_within_bounds() -> None:
    assert learned_ratio(1.0, 1_250, 1_000) == pytest.approx(1.25)
    assert learned_ratio(1.25, 1_250, 1_250) == pytest.approx(1.25)  # the estimate had it
    assert learned_ratio(1.0, 10_000, 1_000) == RATIO_MAX
    assert learned_ratio(1.0, 10, 1_000) == RATIO_MIN
    assert learned_ratio(1.1, 0, 1_000) == 1.1  # no count: nothing learned


def test_the_api_counts_tools_and_their_hidden_prompt() -> None:
    plain = Accounting().request(BODY)
    with_tool = Accounting().request({**BODY, "tools": [TOOL]})
    assert with_tool - plain == TOOL_PROMPT_TOKENS + Accounting().tool(TOOL)
    assert Accounting(count_tools=False).request({**BODY, "tools": [TOOL]}) == plain


@pytest.mark.parametrize("skew", [0.8, 1.25])
def test_a_skewed_tokenizer_counts_every_block_by_its_factor(skew: float) -> None:
    long = {**BODY, "messages": [{"role": "user", "content": "word " * 2_000}]}
    exact, skewed = Accounting().request(long), Accounting(skew=skew).request(long)
    assert skewed == pytest.approx(exact * skew, rel=0.01)


def test_refusals_use_the_apis_words() -> None:
    assert context_problem(101, 0, 100) == too_long_message(101, 100) == (
        "prompt is too long: 101 tokens > 100 maximum")
    assert context_problem(90, 20, 100) == (
        "input length and `max_tokens` exceed context limit: 90 + 20 > 100, decrease input"
        " length or `max_tokens` and try again")
    assert context_problem(80, 20, 100) is None


def test_a_round_gets_its_reply_room_only_when_the_turn_still_fits() -> None:
    window, reply = 16_000, 1_024
    left = window - estimate_margin(window)
    assert round_reply_room(8_000, window, reply, tool_round=True) == reply
    # A tool round leaves room for the now after it; the last round takes what is left.
    tight = left - reply - 100
    assert round_reply_room(tight, window, reply, tool_round=True) is not None
    assert round_reply_room(left - 600, window, reply, tool_round=True) is None
    assert round_reply_room(left - 600, window, reply, tool_round=False) == 600
    assert round_reply_room(left - MIN_ROUND_REPLY + 1, window, reply, tool_round=False) is None
    assert results_room(left - 1_000, 100, window) == 1_000 - 100 - 100 - MIN_ROUND_REPLY
    assert results_room(window, 100, window) == 0


def _row(seq: int, text: str, kind: MessageType = MessageType.USER) -> RecordRow:
    return RecordRow(seq=seq, type=kind, text=text, token_count=count_tokens(text))


def test_a_turns_own_messages_are_carried_not_listed_and_come_back_ticked() -> None:
    moving = [_row(3, "Review the 30 open PRs, oldest first."),
              _row(5, "continue"), _row(6, "[Harness: Task t1 \"x\"] merge all",
                                        MessageType.HARNESS)]
    # #5 is of the turn in progress: carried, not in the checklist.
    offered = memo_candidates([], moving, in_turn_from=5)
    assert [(c.seq, c.kept_before) for c in offered] == [(3, False)]
    # Once its turn is over, a carried message is offered ticked (kept until released).
    later = memo_candidates([_row(5, "continue")], [], in_turn_from=9)
    assert [(c.seq, c.kept_before) for c in later] == [(5, True)]
