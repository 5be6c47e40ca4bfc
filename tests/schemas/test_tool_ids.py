"""`schemas.tools.unique_tool_ids`: every call's id one the API takes, once per session."""

from __future__ import annotations

import itertools
import re

from hypothesis import given
from hypothesis import strategies as st

from schemas.context import assemble_messages
from schemas.messages import MessageType, RecordRow
from schemas.tools import TOOL_ID_PATTERN, unique_tool_ids
from tests.fake_anthropic.rules import check_messages, check_tool_history


def _uses(*ids: object) -> list[dict]:
    return [{"type": "text", "text": "looking"}] + [
        {"type": "tool_use", "id": i, "name": "read_file", "input": {}} for i in ids]


def _ids(blocks: list[dict]) -> list[str]:
    return [b["id"] for b in blocks if b["type"] == "tool_use"]


def test_ids_the_api_takes_and_the_session_has_not_seen_stay_as_they_are():
    blocks = _uses("toolu_01A09q90qw90lq917835lq9", "call_1")
    assert unique_tool_ids(blocks, {"call_0"}, 7) == []
    assert _ids(blocks) == ["toolu_01A09q90qw90lq917835lq9", "call_1"]


def test_an_id_an_earlier_call_has_is_given_anew():
    blocks = _uses("call_0")
    notes = unique_tool_ids(blocks, {"call_0"}, 12)
    assert _ids(blocks) == ["toolu_keel_12_1"]
    assert len(notes) == 1 and "'call_0'" in notes[0] and "toolu_keel_12_1" in notes[0]


def test_ids_repeated_within_one_reply_are_made_distinct():
    blocks = _uses("call_0", "call_0", "call_0")
    unique_tool_ids(blocks, set(), 3)
    assert _ids(blocks) == ["call_0", "toolu_keel_3_2", "toolu_keel_3_3"]


def test_ids_outside_the_api_pattern_are_given_anew():
    blocks = _uses("functions.read_file:0", "", None, "x" * 65, "tab\tid", "ünï")
    unique_tool_ids(blocks, set(), 4)
    assert all(re.fullmatch(TOOL_ID_PATTERN[1:-1], i) for i in _ids(blocks))
    assert len(set(_ids(blocks))) == 6


def test_a_new_id_never_takes_one_already_taken():
    blocks = _uses("dup", "toolu_keel_9_1")
    unique_tool_ids(blocks, {"dup", "toolu_keel_9_1"}, 9)
    ids = _ids(blocks)
    assert len(set(ids)) == 2 and not {"dup", "toolu_keel_9_1"} & set(ids)


@given(st.lists(st.one_of(st.text(max_size=70), st.none(), st.integers()), max_size=8),
       st.sets(st.text(max_size=12), max_size=6))
def test_whatever_the_ids_they_come_out_distinct_untaken_and_well_formed(raw, taken):
    blocks = _uses(*raw)
    unique_tool_ids(blocks, set(taken), 1)
    ids = _ids(blocks)
    assert len(ids) == len(set(ids)) == len(raw)
    assert not set(ids) & set(taken)
    assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", i) for i in ids)


def _row(seq: int, kind: MessageType, text: str, content=None) -> RecordRow:
    return RecordRow(seq=seq, type=kind, text=text, content=content)


def _call(seq: int, call_id: str, path: str) -> RecordRow:
    return _row(seq, MessageType.ASSISTANT, "", [
        {"type": "tool_use", "id": call_id, "name": "read_file", "input": {"path": path}}])


def _result(seq: int, call_id: str, text: str) -> RecordRow:
    return _row(seq, MessageType.TOOL_RESULT, text, {"tool_use_id": call_id})


def test_a_record_written_before_ids_were_unique_still_makes_a_request_the_api_takes():
    """A session recorded before `unique_tool_ids` (the offline model after a restart):
    its second "toolu_offline_4" lost its result and the seq after it stayed empty. The
    request gives that call an id of its own and the error result a lost call gets; the
    first call keeps its id and its result."""
    rows = [_row(1, MessageType.USER, "read a"), _call(2, "toolu_offline_4", "a.txt"),
            _result(3, "toolu_offline_4", "text of a"),
            _row(4, MessageType.ASSISTANT, "read"), _row(5, MessageType.USER, "read b"),
            _call(6, "toolu_offline_4", "b.txt"),  # seq 7, its result, was never written
            _row(8, MessageType.ASSISTANT, "done"),
            _row(9, MessageType.USER, "and c"), _call(10, "functions.read:0", "c.txt"),
            _result(11, "functions.read:0", "text of c"), _row(12, MessageType.ASSISTANT, "ok"),
            _row(13, MessageType.USER, "next")]
    messages, _ = assemble_messages(rows)
    body = {"model": "m", "max_tokens": 10, "messages": messages,
            "tools": [{"name": "read_file", "input_schema": {"type": "object"}}]}
    assert check_messages(body) is None and check_tool_history(body) is None
    pairs = {}
    for ask, answer in itertools.pairwise(messages):
        for use in (b for b in ask["content"] if b["type"] == "tool_use"):
            result = next(b for b in answer["content"] if b.get("tool_use_id") == use["id"])
            pairs[use["input"]["path"]] = (use["id"], result["content"])
    assert pairs["a.txt"] == ("toolu_offline_4", "text of a")
    assert pairs["b.txt"][0] == "toolu_keel_6_0"
    assert pairs["b.txt"][1] == "(no result was recorded for this call)"
    assert pairs["c.txt"] == ("toolu_keel_10_0", "text of c")
    again, _ = assemble_messages(rows)
    assert again == messages  # the same request every turn: its cached prefix holds
