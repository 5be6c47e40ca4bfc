"""The request builders of schemas.request: pure, the same bytes for the same window."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from activities.offline.blocks import prompt_blocks
from activities.offline.cache import PromptCache
from schemas.context import assemble_messages, assemble_with_boundary, with_cache_breakpoints
from schemas.messages import MessageType, RecordRow
from schemas.request import (
    append_user,
    block_count,
    checkpoint_round_messages,
    model_call_request,
    offered_calls_only,
    turn_request,
)

TOOLS = [{"name": "read_file", "description": "read", "input_schema": {"type": "object"}}]


def _rows() -> list[RecordRow]:
    return [
        RecordRow(seq=1, type=MessageType.USER, text="hello", token_count=2),
        RecordRow(seq=2, type=MessageType.ASSISTANT, text="hi", token_count=1,
                  content=[{"type": "text", "text": "hi"}]),
        RecordRow(seq=3, type=MessageType.USER, text="what now?", token_count=3),
    ]


def test_a_model_call_request_is_the_window_with_its_breakpoints():
    rows, block = _rows(), "<memory>a fact</memory>"
    request, notes = model_call_request(
        model="m", max_tokens=100, system="sys", rows=rows, checkpoint_text="ckpt",
        memory_block=block, tools=TOOLS)
    messages, expected_notes = assemble_messages(rows, checkpoint_text="ckpt",
                                                 memory_block=block)
    system, messages = with_cache_breakpoints("sys", messages, checkpoint_text="ckpt",
                                              volatile_text=block)
    assert list(request) == ["model", "max_tokens", "system", "messages", "tools"]
    assert json.dumps(request) == json.dumps({"model": "m", "max_tokens": 100,
                                              "system": system, "messages": messages,
                                              "tools": TOOLS})
    assert notes == expected_notes


def test_no_recall_means_no_volatile_part():
    request, _ = model_call_request(model="m", max_tokens=10, system="sys", rows=_rows(),
                                    checkpoint_text=None, memory_block="", tools=[])
    messages, _ = assemble_messages(_rows())
    assert request["messages"] == with_cache_breakpoints("sys", messages)[1]
    assert request == model_call_request(model="m", max_tokens=10, system="sys",
                                         rows=_rows(), checkpoint_text=None,
                                         memory_block="", tools=[])[0]  # pure


def test_the_turns_boundary_is_a_breakpoint_the_next_turn_reads_back():
    # Issue 20: the next turn's pre-pass shrinks this turn's tool outputs; a breakpoint on
    # the last block before this turn keeps everything before it a cached prefix.
    def marked(request: dict) -> list[str]:
        return [b.get("text", "") for m in request["messages"] for b in m["content"]
                if "cache_control" in b]

    request, _ = model_call_request(model="m", max_tokens=10, system="sys", rows=_rows(),
                                    checkpoint_text=None, memory_block="", tools=[],
                                    turn_first_seq=3)
    assert marked(request) == ["hi", "what now?"]
    plain, _ = model_call_request(model="m", max_tokens=10, system="sys", rows=_rows(),
                                  checkpoint_text=None, memory_block="", tools=[])
    assert marked(plain) == ["what now?"]
    # At most four breakpoints with the recollection and a recall as well.
    full, _ = model_call_request(model="m", max_tokens=10, system="sys", rows=_rows(),
                                 checkpoint_text="ckpt", memory_block="<memory>x</memory>",
                                 tools=[], turn_first_seq=3)
    assert len(marked(full)) + 1 <= 4 and "hi" in marked(full)


def test_append_user_joins_the_users_last_message() -> None:
    messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": "a"}]}]
    append_user(messages, [{"type": "text", "text": "b"}])
    assert messages == [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                     {"type": "text", "text": "b"}]}]
    messages.append({"role": "assistant", "content": [{"type": "text", "text": "c"}]})
    append_user(messages, [{"type": "text", "text": "d"}])
    assert messages[-1] == {"role": "user", "content": [{"type": "text", "text": "d"}]}


def test_a_checkpoint_round_follows_the_conversation_and_its_past_rounds():
    conversation = [{"role": "user", "content": [{"type": "text", "text": "task"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    past = [{"prompt": None, "assistant": [{"type": "tool_use", "id": "t1", "name": "read_file",
                                            "input": {}}],
             "results": [{"type": "tool_result", "tool_use_id": "t1", "content": "done"}]}]
    messages = checkpoint_round_messages(conversation, "write the checkpoint", past,
                                         "last round")
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[2]["content"] == [{"type": "text", "text": "write the checkpoint"}]
    assert messages[4]["content"][-1] == {"type": "text", "text": "last round"}
    request = turn_request(model="m", max_tokens=50, system="sys", messages=messages,
                           conversation_blocks=2, checkpoint_text=None, tools=TOOLS, final=True)
    system, marked = with_cache_breakpoints("sys", messages, stable_blocks=2)
    assert list(request) == ["model", "max_tokens", "system", "messages", "tools",
                             "tool_choice"]
    assert request["tool_choice"] == {"type": "none"}
    assert (request["system"], request["messages"]) == (system, marked)
    assert "tool_choice" not in turn_request(
        model="m", max_tokens=50, system="sys", messages=messages, conversation_blocks=2,
        checkpoint_text=None, tools=TOOLS)


def test_the_flush_and_the_checkpoint_turn_read_the_whole_conversation_from_the_cache():
    # A conversation that ends with a tool result: Keel's words join that user message,
    # yet the conversation's last block is a breakpoint, so the checkpoint turn after the
    # flush reads the newest tool output from the cache instead of writing it again.
    def conversation() -> list[dict]:
        return [
            {"role": "user", "content": [{"type": "text", "text": "review the queue " * 300}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "line\n" * 2000}]},
        ]

    cache = PromptCache(lambda: 0.0)
    usages = []
    for words in ("[Keel: memory flush] write cards", "[Keel: checkpoint request] edit"):
        messages = conversation()
        blocks = block_count(messages)
        append_user(messages, [{"type": "text", "text": words}])
        assert len(messages) == 3  # the words joined the tool result's message
        request = turn_request(model="m", max_tokens=50, system="sys", messages=messages,
                               conversation_blocks=blocks, checkpoint_text=None, tools=TOOLS)
        assert "cache_control" in request["messages"][-1]["content"][0]  # the tool result
        prompt = prompt_blocks(request)
        usages.append(cache.account(request, prompt, min_tokens=1024))
    conversation_tokens = sum(b.tokens for b in prompt[:-1])
    assert usages[0].cache_creation >= conversation_tokens  # the flush writes it once
    assert usages[1].cache_read == conversation_tokens  # the checkpoint turn reads it all
    assert usages[1].cache_creation < 50  # and writes only its own words


# A window as the record can hold it: inputs between a call and its result, calls whose
# result never came, results whose call is outside the window, calls of tools the request
# does not offer, notices.
_ROW_KINDS = st.sampled_from(["user", "call", "offered_call", "two_calls", "result",
                              "stray_result", "notice", "text_reply"])


def _window(kinds: list[str]) -> list[RecordRow]:
    rows: list[RecordRow] = []
    open_calls: list[str] = []
    for seq, kind in enumerate(kinds, start=1):
        if kind == "user":
            rows.append(RecordRow(seq=seq, type=MessageType.USER, text=f"u{seq}"))
        elif kind in ("call", "offered_call", "two_calls"):
            names = {"call": ["made_up"], "offered_call": ["read_file"],
                     "two_calls": ["read_file", "made_up"]}[kind]
            open_calls = [f"c{seq}-{i}" for i in range(len(names))]
            blocks: list[dict[str, Any]] = [
                {"type": "tool_use", "id": call_id, "name": name, "input": {}}
                for call_id, name in zip(open_calls, names, strict=True)]
            rows.append(RecordRow(seq=seq, type=MessageType.ASSISTANT, text="",
                                  content=[{"type": "text", "text": f"a{seq}"}, *blocks]))
        elif kind == "result" and open_calls:
            rows.append(RecordRow(seq=seq, type=MessageType.TOOL_RESULT, text=f"r{seq}",
                                  content={"tool_use_id": open_calls.pop(0)}))
        elif kind == "stray_result":
            rows.append(RecordRow(seq=seq, type=MessageType.TOOL_RESULT, text="late",
                                  content={"tool_use_id": "gone"}))
        elif kind == "notice":
            rows.append(RecordRow(seq=seq, type=MessageType.NOTICE, text="n"))
        else:
            rows.append(RecordRow(seq=seq, type=MessageType.ASSISTANT, text=f"t{seq}",
                                  content=[{"type": "text", "text": f"t{seq}"}]))
    return rows


@settings(max_examples=300, deadline=None)
@given(kinds=st.lists(_ROW_KINDS, max_size=24), cut=st.integers(0, 26),
       checkpoint=st.sampled_from([None, "ckpt"]))
def test_the_turn_boundary_counts_the_blocks_the_earlier_rows_make_on_their_own(
        kinds, cut, checkpoint):
    """One pass counts what assembling the earlier rows apart would (its spec, below)."""
    rows = _window(kinds)
    earlier, _ = assemble_messages([r for r in rows if r.seq < cut],
                                   checkpoint_text=checkpoint)
    expected = sum(len(m["content"]) for m in offered_calls_only(earlier, TOOLS))
    messages, notes, before = assemble_with_boundary(rows, checkpoint_text=checkpoint,
                                                     boundary_seq=cut)
    assert before == expected
    assert (messages, notes) == assemble_messages(rows, checkpoint_text=checkpoint)


def test_breakpoints_leave_the_messages_they_were_given_as_they_were():
    messages, _ = assemble_messages(_rows(), checkpoint_text="ckpt")
    before = json.dumps(messages)
    _, marked = with_cache_breakpoints("sys", messages, checkpoint_text="ckpt",
                                       turn_boundary=2)
    assert json.dumps(messages) == before
    assert sum("cache_control" in b for m in marked for b in m["content"]) == 3


def test_a_message_given_as_a_string_is_one_text_block_when_marked():
    _, marked = with_cache_breakpoints("sys", [{"role": "user", "content": "hello"}])
    assert marked == [{"role": "user", "content": [
        {"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}]}]


_TEXTS = st.sampled_from(["a", "b", "ckpt", "recall"])
_MESSAGES = st.lists(st.one_of(
    _TEXTS, st.lists(_TEXTS.map(lambda t: {"type": "text", "text": t}), min_size=1,
                     max_size=4)), max_size=8).map(
    lambda contents: [{"role": "user" if i % 2 == 0 else "assistant", "content": c}
                      for i, c in enumerate(contents)])


@settings(max_examples=300, deadline=None)
@given(messages=_MESSAGES, checkpoint=st.sampled_from([None, "ckpt"]),
       volatile=st.sampled_from([None, "recall"]), stable=st.sampled_from([None, 1, 2, 5]),
       boundary=st.integers(min_value=0, max_value=12))
def test_breakpoints_mark_at_most_three_blocks_the_last_always_and_change_nothing_else(
        messages: list[dict[str, Any]], checkpoint: str | None, volatile: str | None,
        stable: int | None, boundary: int) -> None:
    before = json.dumps(messages)
    system, marked = with_cache_breakpoints(
        "sys", messages, checkpoint_text=checkpoint, volatile_text=volatile,
        stable_blocks=stable, turn_boundary=boundary)
    assert json.dumps(messages) == before and "cache_control" in system[0]
    flat = [b for m in marked for b in m["content"]]
    marks = [k for k, b in enumerate(flat) if "cache_control" in b]
    assert len(marks) <= 3 and (not flat or marks[-1] == len(flat) - 1)
    if 0 < boundary < len(flat) and not volatile and stable is None:
        assert boundary - 1 in marks  # nothing but the last competes with it
    # Without the marks, the messages given (a string content as its one text block).
    plain = [{"role": m["role"], "content": [{k: v for k, v in b.items() if k != "cache_control"}
                                             for b in m["content"]]} for m in marked]
    assert plain == [{"role": m["role"], "content": m["content"] if isinstance(
        m["content"], list) else [{"type": "text", "text": m["content"]}]} for m in messages]
