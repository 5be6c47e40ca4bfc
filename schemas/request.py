"""The Messages API requests Keel sends, built from what was loaded: pure, no I/O.

One shape for every request (`model`, `max_tokens`, `system`, `messages`, `tools`, in that
order, and `tool_choice` only on a checkpoint turn's last round), so a request is the same
bytes whenever it is built from the same window: the prompt cache and the fake API that
tests count requests with both key on them. Cache breakpoints come from the one builder
(`schemas.context.with_cache_breakpoints`): a model call's stable end is the block before
this turn's recall; a checkpoint turn's (and the memory flush's, which shares its prefix)
is the end of the conversation, before Keel's instruction.

A request is valid for the Messages API whatever the model did and whatever the tool list
became: a tool call whose tool the request does not offer (a name the model invented, a
server removed, a `set_agent` that dropped a tool) is shown with its result as text
(`offered_calls_only`), so no request carries a `tool_use` naming a tool it does not
define, nor any tool block when it defines none. The record keeps the call as it was.
"""

from __future__ import annotations

import json
from typing import Any

from schemas.context import assemble_with_boundary, with_cache_breakpoints
from schemas.messages import RecordRow

__all__ = ["append_user", "block_count", "checkpoint_round_messages", "model_call_request",
           "offered_calls_only", "turn_request"]


def _request(model: str, max_tokens: int, system: list[dict[str, Any]],
             messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "system": system, "messages": messages,
            "tools": tools}


def _call_text(block: dict[str, Any]) -> dict[str, Any]:
    payload = json.dumps(block.get("input", {}), ensure_ascii=False, sort_keys=True)
    return {"type": "text", "text": f"[Keel: call {block.get('id')} of {block.get('name')!s}, a "
                                    f"tool this request does not offer, with input {payload}]"}


def _result_text(block: dict[str, Any], name: str) -> dict[str, Any]:
    content = block.get("content")
    if isinstance(content, list):
        content = "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    error = " (an error)" if block.get("is_error") else ""
    return {"type": "text", "text": f"[Keel: the result of call {block.get('tool_use_id')} "
                                    f"of {name}{error}:]\n{content or '(empty)'}"}


def offered_calls_only(messages: list[dict[str, Any]],
                       tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` (a copy where anything changes) with every tool call whose name is not
    among `tools`, and its result, as text blocks. In the message after such a call, the
    results of the offered calls still come first, as the API requires; the texts follow
    them, then the message's other blocks in their order."""
    offered = {t.get("name") for t in tools}
    out: list[dict[str, Any]] = []
    shown: dict[str, str] = {}  # the ids of the calls shown as text -> their tool's name
    for message in messages:
        blocks = message["content"]
        if not isinstance(blocks, list):
            out.append(message)
            continue
        if message["role"] == "assistant":
            if not any(b.get("type") == "tool_use" and b.get("name") not in offered
                       for b in blocks):
                out.append(message)
                continue
            changed = []
            for b in blocks:
                if b.get("type") == "tool_use" and b.get("name") not in offered:
                    shown[str(b.get("id"))] = str(b.get("name"))
                    changed.append(_call_text(b))
                else:
                    changed.append(b)
            out.append({**message, "content": changed})
            continue
        if not any(b.get("type") == "tool_result" and str(b.get("tool_use_id")) in shown
                   for b in blocks):
            out.append(message)
            continue
        results, texts, rest = [], [], []
        for b in blocks:
            if b.get("type") == "tool_result" and str(b.get("tool_use_id")) in shown:
                texts.append(_result_text(b, shown[str(b.get("tool_use_id"))]))
            elif b.get("type") == "tool_result":
                results.append(b)
            else:
                rest.append(b)
        out.append({**message, "content": results + texts + rest})
    return out


def model_call_request(*, model: str, max_tokens: int, system: str, rows: list[RecordRow],
                       checkpoint_text: str | None, memory_block: str,
                       tools: list[dict[str, Any]], turn_first_seq: int | None = None,
                       cache_ttl: str = "5m") -> tuple[dict[str, Any], list[str]]:
    """A session's model call over `rows`, with this turn's recall fenced beside the
    newest input; and the assembly's notes (what it had to leave out or mend).

    `turn_first_seq`: the turn's first row. The blocks before it are what the next turn's
    pre-pass leaves as they are now, so a breakpoint at their end is read back from the
    cache by the next turn even when the pre-pass shrinks this turn's tool outputs.
    `cache_ttl`: the lifetime of its cache entries (schemas.cache_ttl)."""
    # `before`: the blocks the rows before the turn assemble into on their own (showing a
    # call as text keeps its count of blocks), counted in the same pass.
    messages, notes, before = assemble_with_boundary(
        rows, checkpoint_text=checkpoint_text, memory_block=memory_block or None,
        boundary_seq=turn_first_seq)
    messages = offered_calls_only(messages, tools)
    system_blocks, messages = with_cache_breakpoints(
        system, messages, checkpoint_text=checkpoint_text, volatile_text=memory_block or None,
        turn_boundary=before, ttl=cache_ttl)
    return _request(model, max_tokens, system_blocks, messages, tools), notes


def block_count(messages: list[dict[str, Any]]) -> int:
    """The content blocks of `messages` (what a breakpoint position counts in)."""
    return sum(len(m["content"]) if isinstance(m["content"], list) else 1 for m in messages)


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
                 conversation_blocks: int, checkpoint_text: str | None,
                 tools: list[dict[str, Any]], final: bool = False) -> dict[str, Any]:
    """A request of the checkpoint turn (or of the memory flush before it): the same tools,
    system prompt and conversation prefix as the request it follows, so it reads them from
    the cache; the turn's limits are enforced on its calls, never by changing the tools.
    The last round (`final`) may call no tool.

    `conversation_blocks`: the conversation's blocks (`block_count` before Keel's words
    were added). Its last block is a breakpoint, so the flush and every round of the turn
    after it read the whole conversation from the cache, even when Keel's words joined
    the conversation's last user message (a tool result's)."""
    system_blocks, marked = with_cache_breakpoints(
        system, offered_calls_only(messages, tools), checkpoint_text=checkpoint_text,
        stable_blocks=conversation_blocks)
    request = _request(model, max_tokens, system_blocks, marked, tools)
    if final:
        request["tool_choice"] = {"type": "none"}
    return request
