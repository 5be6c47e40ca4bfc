"""A reply as the API streams it (server-sent events, docs: "Streaming Messages").

message_start (the Message with empty content and the input usage), then for each block
content_block_start / content_block_delta... / content_block_stop (a ping after the first
start), then message_delta (stop_reason, usage with output_tokens), then message_stop.
Text comes in several text_delta pieces; a tool_use's input as input_json_delta pieces of
its JSON, the first one empty, as the API sends them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

TEXT_PIECE_WORDS = 3
JSON_PIECE_CHARS = 12


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def text_pieces(text: str) -> list[str]:
    words = re.findall(r"\S+\s*|\s+", text)
    pieces = ["".join(words[i:i + TEXT_PIECE_WORDS])
              for i in range(0, len(words), TEXT_PIECE_WORDS)]
    return pieces or [text]


def json_pieces(value: Any) -> list[str]:
    raw = json.dumps(value)
    return [""] + [raw[i:i + JSON_PIECE_CHARS] for i in range(0, len(raw), JSON_PIECE_CHARS)]


def _block_events(index: int, block: dict[str, Any]) -> Iterator[bytes]:
    kind = block.get("type")
    if kind == "text":
        start = {**block, "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in text_pieces(block["text"])]
    elif kind == "tool_use":
        start = {**block, "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": p}
                  for p in json_pieces(block.get("input", {}))]
    elif kind == "thinking":
        start = {**block, "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": p}
                  for p in text_pieces(block.get("thinking", ""))]
        deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
    else:  # blocks without deltas arrive whole
        start, deltas = block, []
    yield sse("content_block_start", {"type": "content_block_start", "index": index,
                                      "content_block": start})
    if index == 0:
        yield sse("ping", {"type": "ping"})
    for delta in deltas:
        yield sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": delta})
    yield sse("content_block_stop", {"type": "content_block_stop", "index": index})


def message_start(message: dict[str, Any]) -> bytes:
    usage = {**message["usage"], "output_tokens": min(1, message["usage"]["output_tokens"])}
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": usage}
    return sse("message_start", {"type": "message_start", "message": start})


def stream_events(message: dict[str, Any]) -> Iterator[bytes]:
    yield message_start(message)
    for index, block in enumerate(message.get("content", [])):
        yield from _block_events(index, block)
    usage = message["usage"]
    delta_usage = {k: usage[k] for k in ("input_tokens", "cache_creation_input_tokens",
                                         "cache_read_input_tokens", "output_tokens")
                   if usage.get(k) is not None}
    yield sse("message_delta", {"type": "message_delta",
                                "delta": {"stop_reason": message.get("stop_reason"),
                                          "stop_sequence": message.get("stop_sequence")},
                                "usage": delta_usage})
    yield sse("message_stop", {"type": "message_stop"})


def error_event(body: dict[str, Any]) -> bytes:
    return sse("error", {"type": "error", "error": body["error"]})
