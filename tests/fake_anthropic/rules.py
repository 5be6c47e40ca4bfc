"""The request rules the real Messages API enforces, with its own wording where known.

Each check returns None or the message of the 400 `invalid_request_error` the API would
send. Wordings are the API's as they appear in its error responses (quoted in public bug
reports); the "messages.N" / "tools.N" paths point at the offending item as the API's do.

Tool blocks in the history (`check_tool_history`): a request carrying a `tool_use` or
`tool_result` block must define tools (the API's answer, quoted in
anthropics/anthropic-sdk-python#494: "Requests which include tool_use or tool_result blocks
must define tools."), and, stricter than anything the API documents, every `tool_use` must
name one of the request's tools: whatever the API's exact rule, a history that passes this
one passes it too.

Image and document blocks (`media.py`): their fields with the other field checks, their
files (type, size, pixels, pages) once the messages are whole.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from activities.offline.accounting import context_problem, too_long_message
from activities.offline.blocks import Block, message_blocks, prompt_blocks, system_blocks
from activities.offline.cache import breakpoints
from activities.offline.models import ModelLimits
from tests.fake_anthropic.media import check_media, check_media_fields

MAX_CACHE_BREAKPOINTS = 4
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
TOOL_NAME_PATTERN = "^[a-zA-Z0-9_-]{1,128}$"
# A tool_use block's id and a tool_result's tool_use_id (the API's answer to an id from
# another provider, quoted in anomalyco/opencode#1279).
TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
TOOL_ID_PATTERN = "^[a-zA-Z0-9_-]+$"


def check_fields(body: Any, *, count_tokens_endpoint: bool = False) -> str | None:
    if not isinstance(body, dict):
        return "Input should be a valid dictionary or object to extract fields from"
    required = ("model", "messages") if count_tokens_endpoint else (
        "model", "max_tokens", "messages")
    for name in required:
        if name not in body or body[name] is None:
            return f"{name}: Field required"
    if not isinstance(body["messages"], list):
        return "messages: Input should be a valid list"
    if not body["messages"]:
        return "messages: at least one message is required"
    if not count_tokens_endpoint:
        max_tokens = body["max_tokens"]
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            return "max_tokens: Input should be a valid integer"
        if max_tokens < 1:
            return "max_tokens: Input should be greater than or equal to 1"
    return None


def check_messages(body: dict[str, Any]) -> str | None:
    messages = body["messages"]
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if "content" not in m:
            return f"messages.{i}.content: Field required"
        content = m.get("content")
        last_assistant = i == len(messages) - 1 and m["role"] == "assistant"
        if content in ("", []) and not last_assistant:
            return (f"messages.{i}: all messages must have non-empty content except for the"
                    " optional final assistant message")
    for where, items in [("system", system_blocks(body))] + [
            ("messages", message_blocks(m)) for m in messages]:
        for b in items:
            if b.get("type") == "text":
                text = b.get("text")
                if not isinstance(text, str) or text == "":
                    return f"{where}: text content blocks must be non-empty"
                if not text.strip():
                    return f"{where}: text content blocks must contain non-whitespace text"
    return _check_tool_pairing(messages)


def _ids(blocks: list[dict[str, Any]], kind: str, field: str) -> list[str]:
    return [str(b.get(field)) for b in blocks if b.get("type") == kind]


def _check_tool_pairing(messages: list[dict[str, Any]]) -> str | None:
    seen: set[str] = set()
    for i, m in enumerate(messages):
        blocks = message_blocks(m)
        for j, b in enumerate(blocks):
            for kind, field in (("tool_use", "id"), ("tool_result", "tool_use_id")):
                if b.get("type") == kind and not TOOL_ID.match(str(b.get(field))):
                    return (f"messages.{i}.content.{j}.{kind}.{field}: String should match"
                            f" pattern '{TOOL_ID_PATTERN}'")
            if b.get("type") == "tool_use":
                if str(b.get("id")) in seen:
                    return f"messages.{i}.content.{j}: `tool_use` ids must be unique"
                seen.add(str(b.get("id")))
        # A tool_result answers a tool_use of the message just before it.
        if m["role"] == "user":
            before = messages[i - 1] if i > 0 else None
            offered = set(_ids(message_blocks(before), "tool_use", "id")) if (
                before is not None and before["role"] == "assistant") else set()
            for j, b in enumerate(blocks):
                if b.get("type") == "tool_result" and str(b.get("tool_use_id")) not in offered:
                    return (f"messages.{i}.content.{j}: unexpected `tool_use_id` found in"
                            f" `tool_result` blocks: {b.get('tool_use_id')}. Each"
                            " `tool_result` block must have a corresponding `tool_use` block"
                            " in the previous message.")
        # A tool_use is answered at the very start of the next message, when there is one.
        if m["role"] != "assistant" or i + 1 >= len(messages):
            continue
        asked = _ids(blocks, "tool_use", "id")
        if not asked:
            continue
        after = messages[i + 1]
        answer = message_blocks(after) if after["role"] == "user" else []
        leading: list[str] = []
        for b in answer:
            if b.get("type") != "tool_result":
                break
            leading.append(str(b.get("tool_use_id")))
        anywhere = set(_ids(answer, "tool_result", "tool_use_id"))
        missing = [t for t in asked if t not in leading]
        if not missing:
            continue
        if all(t in anywhere for t in missing):  # answered, but not first in the message
            return (f"messages.{i + 1}: Did not find {len(asked)} `tool_result` block(s) at"
                    " the beginning of this message. Messages following `tool_use` blocks"
                    " must begin with a matching number of `tool_result` blocks.")
        return (f"messages.{i}: `tool_use` ids were found without `tool_result` blocks"
                f" immediately after: {', '.join(missing)}. Each `tool_use` block must have"
                " a corresponding `tool_result` block in the next message.")
    return None


def check_tool_history(body: dict[str, Any]) -> str | None:
    """Tool blocks need tools, and each `tool_use` a tool of this request by its name."""
    tools = body.get("tools")
    names = {t.get("name") for t in tools if isinstance(t, dict)} if isinstance(
        tools, list) else set()
    for i, m in enumerate(body["messages"]):
        for j, b in enumerate(message_blocks(m)):
            kind = b.get("type")
            if kind in ("tool_use", "tool_result") and not names:
                return ("Requests which include tool_use or tool_result blocks must define"
                        " tools.")
            if kind == "tool_use" and b.get("name") not in names:
                return (f"messages.{i}.content.{j}.tool_use.name: {b.get('name')!r} is not"
                        " the name of any tool in `tools`")
    return None


def check_tools(body: dict[str, Any]) -> str | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        return "tools: Input should be a valid list"
    names: list[str] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            return f"tools.{i}: Input should be a valid dictionary or object"
        custom = tool.get("type") in (None, "custom")
        name = tool.get("name")
        if custom:
            if not isinstance(name, str) or not TOOL_NAME.match(name):
                return f"tools.{i}.custom.name: String should match pattern '{TOOL_NAME_PATTERN}'"
            if "input_schema" not in tool:
                return f"tools.{i}.custom.input_schema: Field required"
        names.append(str(name))
    if len(set(names)) != len(names):
        return "tools: Tool names must be unique."
    return None


def check_cache_control(body: dict[str, Any],
                        blocks: list[Block] | None = None) -> str | None:
    """`blocks`: `prompt_blocks(body)` if the caller has them already (same result)."""
    if blocks is None:
        blocks = prompt_blocks(body)
    for b in blocks:
        control = b.cache_control
        if control is None:
            continue
        if control.get("type") != "ephemeral":
            return f"{b.where}.cache_control.type: Input should be 'ephemeral'"
        if control.get("ttl") not in (None, "5m", "1h"):
            return f"{b.where}.cache_control.ephemeral.ttl: Input should be '5m' or '1h'"
        if b.kind == "thinking":
            return f"{b.where}.thinking.cache_control: Extra inputs are not permitted"
    points = breakpoints(body, blocks)
    short = False  # a 5-minute breakpoint came before (tools, system, messages: in order)
    for index, ttl in points:
        if ttl == "1h" and short:
            return (f"{blocks[index].where}.cache_control.ttl: a ttl='1h' cache_control block"
                    " must not come after a ttl='5m' cache_control block. Note that blocks"
                    " are processed in the following order: `tools`, `system`, `messages`.")
        short = short or ttl == "5m"
    found = len(points)
    if found > MAX_CACHE_BREAKPOINTS:
        return (f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be"
                f" provided. Found {found}.")
    return None


def check_size(body: dict[str, Any], prompt_tokens: int, limits: ModelLimits,
               *, count_tokens_endpoint: bool = False, output_limit: bool = True) -> str | None:
    window = limits.context_window
    if count_tokens_endpoint:
        return too_long_message(prompt_tokens, window) if prompt_tokens > window else None
    max_tokens = int(body.get("max_tokens") or 0)
    if prompt_tokens <= window and output_limit and max_tokens > limits.max_output_tokens:
        return (f"max_tokens: {max_tokens} > {limits.max_output_tokens}, which is the maximum"
                f" allowed number of output tokens for {body['model']}")
    return context_problem(prompt_tokens, max_tokens, window)


def check_request(body: Any, limits_of: Any, prompt_tokens_of: Any,
                  *, count_tokens_endpoint: bool = False,
                  blocks_of: Callable[[dict[str, Any]], list[Block]] | None = None,
                  ) -> str | None:
    """The first rule this request breaks, or None. `limits_of(body)` gives the model's
    limits; `prompt_tokens_of(body)` the prompt's size; `blocks_of(body)`, if given,
    `prompt_blocks(body)` (so a caller that needs them again walks the body once)."""
    problem = check_fields(body, count_tokens_endpoint=count_tokens_endpoint)
    if problem:
        return problem
    for check in (check_tools, check_media_fields, check_messages, check_tool_history,
                  check_media):
        problem = check(body)
        if problem:
            return problem
    problem = check_cache_control(body, blocks_of(body) if blocks_of else None)
    if problem:
        return problem
    return check_size(body, prompt_tokens_of(body), limits_of(body),
                      count_tokens_endpoint=count_tokens_endpoint)
