"""`schemas.tools.unique_tool_ids`: every call's id one the API takes, once per session."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from schemas.tools import TOOL_ID_PATTERN, unique_tool_ids


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
