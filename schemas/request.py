"""The Messages API requests Keel sends, built from what was loaded: pure, no I/O.

One shape for every request (`model`, `max_tokens`, `system`, `messages`, `tools`, in that
order, and `tool_choice` only on a checkpoint turn's last round), so a request is the same
bytes whenever it is built from the same window: the prompt cache and the fake API that
tests count requests with both key on them. Cache breakpoints come from the one builder
(`schemas.context.with_cache_breakpoints`): a model call's stable end is the block before
this turn's recall; a checkpoint turn's (and the memory flush's, which shares its prefix)
is the end of the conversation, before Keel's instruction.
"""

from __future__ import annotations

from typing import Any

from schemas.context import assemble_messages, with_cache_breakpoints
from schemas.messages import RecordRow

__all__ = ["append_user", "checkpoint_round_messages", "model_call_request", "turn_request"]


def _request(model: str, max_tokens: int, system: list[dict[str, Any]],
             messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "system": system, "messages": messages,
            "tools": tools}


def model_call_request(*, model: str, max_tokens: int, system: str, rows: list[RecordRow],
                       checkpoint_text: str | None, memory_block: str,
                       tools: list[dict[str, Any]],
                       turn_first_seq: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """A session's model call over `rows`, with this turn's recall fenced beside the
    newest input; and the assembly's notes (what it had to leave out or mend).

    `turn_first_seq`: the turn's first row. The blocks before it are what the next turn's
    pre-pass leaves as they are now, so a breakpoint at their end is read back from the
    cache by the next turn even when the pre-pass shrinks this turn's tool outputs."""
    messages, notes = assemble_messages(rows, checkpoint_text=checkpoint_text,
                                        memory_block=memory_block or None)
    before = 0
    if turn_first_seq is not None:
        earlier, _ = assemble_messages([r for r in rows if r.seq < turn_first_seq],
                                       checkpoint_text=checkpoint_text)
        before = sum(len(m["content"]) for m in earlier)
    system_blocks, messages = with_cache_breakpoints(
        system, messages, checkpoint_text=checkpoint_text, volatile_text=memory_block or None,
        turn_boundary=before)
    return _request(model, max_tokens, system_blocks, messages, tools), notes


def append_user(messages: list[dict[str, Any]], blocks: list[dict[str, Any]]) -> None:
    """Add `blocks` as the user's: to the last message when it is the user's already."""
    if messages and messages[-1]["role"] == "user":
        messages[-1]["content"].extend(blocks)
    else:
        messages.append({"role": "user", "content": list(blocks)})


def checkpoint_round_messages(conversation: list[dict[str, Any]], instruction: str,
                              rounds: list[dict[str, Any]],
                              prompt: str | None) -> list[dict[str, Any]]:
    """The checkpoint turn's messages after the conversation (changed in place and
    returned): the instruction, each past round (its prompt, the assistant's blocks, the
    tool results) and this round's prompt."""
    messages = conversation
    append_user(messages, [{"type": "text", "text": instruction}])
    for past in rounds:
        if past.get("prompt"):
            append_user(messages, [{"type": "text", "text": past["prompt"]}])
        messages.append({"role": "assistant", "content": past["assistant"]})
        if past["results"]:
            append_user(messages, past["results"])
    if prompt:
        append_user(messages, [{"type": "text", "text": prompt}])
    return messages


def turn_request(*, model: str, max_tokens: int, system: str, messages: list[dict[str, Any]],
                 conversation_end: int, checkpoint_text: str | None,
                 tools: list[dict[str, Any]], final: bool = False) -> dict[str, Any]:
    """A request of the checkpoint turn (or of the memory flush before it): the same tools,
    system prompt and conversation prefix as the request it follows, so it reads them from
    the cache; the turn's limits are enforced on its calls, never by changing the tools.
    The last round (`final`) may call no tool."""
    system_blocks, marked = with_cache_breakpoints(
        system, messages, checkpoint_text=checkpoint_text, stable_end=conversation_end)
    request = _request(model, max_tokens, system_blocks, marked, tools)
    if final:
        request["tool_choice"] = {"type": "none"}
    return request
