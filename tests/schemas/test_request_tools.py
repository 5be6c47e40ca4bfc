"""A request stays valid however the tool list changes (issue 21, defect 3): a tool call
whose tool the request does not offer goes to the model as text with its result
(schemas.request.offered_calls_only); the fake's rules, held to the API's, accept every
request so built. Pure: no server."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from schemas.messages import MessageType, RecordRow
from schemas.request import model_call_request, offered_calls_only, turn_request
from tests.fake_anthropic.rules import check_messages, check_tool_history


def tool(name: str) -> dict:
    return {"name": name, "description": "", "input_schema": {"type": "object"}}


def use(id_: str, name: str) -> dict:
    return {"type": "tool_use", "id": id_, "name": name, "input": {"q": id_}}


def result(id_: str, text: str = "done", error: bool = False) -> dict:
    return {"type": "tool_result", "tool_use_id": id_, "content": text, "is_error": error}


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def valid(request: dict) -> bool:
    return check_messages(request) is None and check_tool_history(request) is None


def test_a_call_of_a_tool_not_offered_goes_as_text_after_the_offered_results():
    messages = [{"role": "user", "content": [text("go")]},
                {"role": "assistant", "content": [text("two calls"), use("t1", "gone"),
                                                  use("t2", "read_file")]},
                {"role": "user", "content": [result("t1", "no such tool", error=True),
                                             result("t2", "file text"), text("and then?")]}]
    before = copy.deepcopy(messages)
    out = offered_calls_only(messages, [tool("read_file")])
    assert messages == before  # the record's messages are left as they were
    assert out[1]["content"][1] == text(
        '[Keel: call t1 of gone, a tool this request does not offer, with input {"q": "t1"}]')
    assert out[1]["content"][2] == use("t2", "read_file")
    assert [b["type"] for b in out[2]["content"]] == ["tool_result", "text", "text"]
    assert out[2]["content"][1]["text"] == ("[Keel: the result of call t1 of gone (an error):]"
                                            "\nno such tool")
    assert valid({"messages": out, "tools": [tool("read_file")]})
    assert not valid({"messages": messages, "tools": [tool("read_file")]})


def test_with_no_tools_at_all_no_tool_block_is_left():
    messages = [{"role": "user", "content": [text("go")]},
                {"role": "assistant", "content": [use("t1", "read_file")]},
                {"role": "user", "content": [result("t1")]}]
    out = offered_calls_only(messages, [])
    assert not [b for m in out for b in m["content"] if b["type"] != "text"]
    assert valid({"messages": out, "tools": []})
    assert check_tool_history({"messages": messages, "tools": []}) == (
        "Requests which include tool_use or tool_result blocks must define tools.")


def _rows(names: list[str]) -> list[RecordRow]:
    rows = [RecordRow(seq=1, type=MessageType.USER, text="go", token_count=1)]
    seq = 2
    for i, name in enumerate(names):
        rows.append(RecordRow(seq=seq, type=MessageType.ASSISTANT, text="", token_count=1,
                              content=[use(f"t{i}", name)]))
        rows.append(RecordRow(seq=seq + 1, type=MessageType.TOOL_RESULT, text="r",
                              token_count=1,
                              content={"tool_use_id": f"t{i}", "is_error": False}))
        seq += 2
    rows.append(RecordRow(seq=seq, type=MessageType.USER, text="next", token_count=1))
    return rows


@given(called=st.lists(st.sampled_from(["read_file", "write_file", "mcp__docs__search",
                                        "invented.name", ""]), max_size=5),
       offered=st.lists(st.sampled_from(["read_file", "write_file", "mcp__docs__search"]),
                        unique=True, max_size=3))
def test_every_request_is_valid_whatever_was_called_and_is_offered_now(called, offered):
    tools = [tool(n) for n in offered]
    request, _ = model_call_request(model="m", max_tokens=10, system="s", rows=_rows(called),
                                    checkpoint_text=None, memory_block="recall", tools=tools)
    assert valid(request)
    kept = [b["name"] for m in request["messages"] for b in m["content"]
            if b.get("type") == "tool_use"]
    assert kept == [n for n in called if n in offered]
    # The checkpoint turn over the same window keeps the same prefix, byte for byte.
    turn = turn_request(model="m", max_tokens=10, system="s",
                        messages=model_call_request(
                            model="m", max_tokens=10, system="s", rows=_rows(called),
                            checkpoint_text=None, memory_block="", tools=tools)[0]["messages"],
                        conversation_blocks=2, checkpoint_text=None, tools=tools)
    assert valid(turn)
