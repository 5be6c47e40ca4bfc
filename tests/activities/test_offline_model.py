"""The offline model's plain turns (activities.offline.model): what starts the queue job and
what gets a plain answer. Pure: no server."""

from __future__ import annotations

from typing import Any

from activities.offline import respond

TOOLS = [{"name": "read_file", "input_schema": {"type": "object"}},
         {"name": "write_file", "input_schema": {"type": "object"}}]


def _ask(*turns: str) -> dict[str, Any]:
    """The model's answer to the last of `turns` (the person's), its own earlier replies
    between them as it wrote them."""
    messages: list[dict[str, Any]] = []
    for said in turns:
        messages.append({"role": "user", "content": [{"type": "text", "text": said}]})
        reply = respond({"model": "keel-offline-model", "max_tokens": 1024,
                         "messages": messages, "tools": TOOLS})
        messages.append({"role": "assistant", "content": reply["content"]})
    return reply


def test_its_own_offer_of_the_queue_does_not_start_the_queue() -> None:
    # Its first answer names "the pull-request queue in queue.md"; the next message, about
    # anything, read prs/1.md and answered "The queue is done: there is no PR #1".
    reply = _ask("hello there, remember I like tea", "what do I like")
    assert reply["stop_reason"] == "end_turn"
    assert [b["type"] for b in reply["content"]] == ["text"]
    assert 'I received: "what do I like"' in reply["content"][0]["text"]


def test_a_person_who_asks_for_the_queue_gets_it_worked() -> None:
    reply = _ask("hello", "please work through the queue in queue.md, oldest first")
    calls = [b for b in reply["content"] if b["type"] == "tool_use"]
    assert [(c["name"], c["input"]) for c in calls] == [("read_file", {"path": "queue.md"})]
