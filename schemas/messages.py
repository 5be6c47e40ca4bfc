"""What the record holds, and how each input is labelled by where it came from.

The source line of a background input is written from the handler that received it,
never from its text; a user's message that itself begins like a source line is shown with
the user's name before it, so no text can pass for a harness input.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

HARNESS_PREFIX = "[Harness:"


class MessageType(StrEnum):
    USER = "user"
    HARNESS = "harness"
    ASSISTANT = "assistant"
    TOOL_RESULT = "tool_result"
    NOTICE = "notice"  # Keel's own words to the user (errors, "too long"); never sent to the model
    CHECKPOINT = "checkpoint"  # the recap row: the live window starts after the newest one


class HarnessKind(StrEnum):
    WATCH = "watch"
    TASK = "task"
    AGENT_RUN = "agent_run"
    CALLBACK = "callback"


def _quoted(name: str) -> str:
    # A name is data: keep it on one line and keep its quotes from closing ours.
    return '"' + " ".join(name.split()).replace('"', "'") + '"'


def _token(value: str) -> str:
    return "".join(value.split()).replace("]", "")


def watch_source_line(watch_id: str, name: str) -> str:
    return f"[Harness: Watch {_token(watch_id)} {_quoted(name)}]"


def task_source_line(task_id: str, name: str) -> str:
    return f"[Harness: Task {_token(task_id)} {_quoted(name)}]"


def agent_run_source_line(run_id: str, from_session: str) -> str:
    return f"[Harness: agent run {_token(run_id)} from #{_token(from_session)}]"


def callback_source_line(run_id: str, from_session: str) -> str:
    return f"[Harness: callback of run {_token(run_id)} from #{_token(from_session)}]"


def user_display_prefix(text: str, user_name: str) -> str | None:
    """The prefix a user's message gets when its text could pass for a source line."""
    if text.lstrip().startswith(HARNESS_PREFIX):
        return f"{user_name}:"
    return None


class RecordRow(BaseModel):
    """One row of the conversation of record, as context assembly needs it."""

    seq: int
    type: MessageType
    text: str
    source_line: str | None = None
    # Assistant rows: the API content blocks (text and tool_use). Tool results:
    # {"tool_use_id": ..., "is_error": bool}.
    content: list[dict[str, Any]] | dict[str, Any] | None = None
    token_count: int = 0
    turn: int | None = None

    def rendered_text(self) -> str:
        """The text as the model sees it: the source line (or user prefix) before the body."""
        if self.source_line:
            sep = "\n" if self.type == MessageType.HARNESS else " "
            return f"{self.source_line}{sep}{self.text}"
        return self.text


class ToolCall(BaseModel):
    id: str
    name: str


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    @property
    def context_tokens(self) -> int:
        return self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens


class ModelReply(BaseModel):
    """What the model-call activity returns: small, never the conversation."""

    seq: int
    stop_reason: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    text: str = ""  # the final text of this reply (bounded by the output limit)
    reply_tokens: int = 0
    model: str = ""
