"""What the record holds, and how each input is labelled by where it came from.

The source line of a background input is written from the handler that received it,
never from its text; a user's message that itself begins like a source line is shown with
the user's name before it, so no text can pass for a harness input: not behind invisible or
format characters, whitespace of any kind, compatibility or lookalike forms of the bracket
and of the word (``looks_like_source_line``).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from schemas.attachments import attachments_of, with_lines

HARNESS_PREFIX = "[Harness:"


class MessageType(StrEnum):
    USER = "user"
    HARNESS = "harness"
    ASSISTANT = "assistant"
    TOOL_RESULT = "tool_result"
    NOTICE = "notice"  # Keel's own words to the user (errors, "too long"); never sent to the model
    CHECKPOINT = "checkpoint"  # the recap row: the live window starts after the newest one


# Rows never sent as messages: Keel's notices, and checkpoint rows (their recap rides in the
# request as the checkpoint's text). Neither is counted in a request's estimate.
NOT_SENT: frozenset[MessageType] = frozenset({MessageType.NOTICE, MessageType.CHECKPOINT})


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


def wakeup_source_line(wakeup_id: str, note: str) -> str:
    """A wakeup the agent scheduled, firing: a Task in Keel's voice (schemas.initiative)."""
    return f"[Harness: Task wakeup {_token(wakeup_id)} {_quoted(note)}]"


def agent_run_source_line(run_id: str, from_session: str) -> str:
    return f"[Harness: agent run {_token(run_id)} from #{_token(from_session)}]"


def callback_source_line(run_id: str, from_session: str) -> str:
    return f"[Harness: callback of run {_token(run_id)} from #{_token(from_session)}]"


# Default_Ignorable_Code_Point, from Unicode's DerivedCoreProperties.txt (15.1), reserved
# code points included: they render as nothing, whatever Python's unicodedata version knows.
_DEFAULT_IGNORABLE: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160),
    (0x17B4, 0x17B5), (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
# Characters that render as nothing or as space: controls, format characters, separators,
# combining marks with no base to sit on, surrogates, and U+2800 BRAILLE PATTERN BLANK.
_BLANK_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp", "Mn", "Me"})
_BLANK_EXTRA = frozenset({"\u2800"})
# Openers a label could hide behind, tested after NFKC (which folds ［ and ﹇ to "["): every
# opening punctuation (Ps: ( [ { ⁅ ⟦ 【 〔 ﹝ ⦋ ...) and initial quote (Pi: « ‘ “ ‹ ...), plus
# "<" and the square-bracket pieces ⎡ ⎢ ⎣, which are math symbols.
_OPENER_CATEGORIES = frozenset({"Ps", "Pi"})
_OPENER_EXTRA = frozenset("<\u23a1\u23a2\u23a3")
# Letters of "harness" that NFKC does not fold but that look the same (from Unicode's
# confusables for these letters): Cyrillic, Greek, Armenian and small capitals. Capitals
# are folded before casefolding (Greek Η looks like H, its lowercase η like n).
_LOOKALIKE_UPPER = str.maketrans({
    "\u0397": "h", "\u041d": "h", "\u04ba": "h", "\u0391": "a", "\u0410": "a",
    "\u0395": "e", "\u0415": "e", "\u039d": "n", "\u0405": "s",
})
_LOOKALIKE = str.maketrans({
    "\u043d": "h",
    "\u04bb": "h", "\u029c": "h",
    "\u0430": "a", "\u0251": "a", "\u03b1": "a", "\u1d00": "a",
    "\u0433": "r", "\u0280": "r",
    "\u0578": "n", "\u0274": "n", "\u043f": "n", "\u03b7": "n",
    "\u0435": "e", "\u1d07": "e", "\u03b5": "e",
    "\u0455": "s", "\ua731": "s",
})
_WORD = "harness"
# At most this many punctuation and symbol characters before the word: more is visibly
# not a label, and the bound keeps the check short on any text.
_MAX_LEAD = 32


def _is_blank(ch: str) -> bool:
    """True when ``ch`` renders as nothing or as space."""
    if ch in _BLANK_EXTRA or unicodedata.category(ch) in _BLANK_CATEGORIES:
        return True
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _DEFAULT_IGNORABLE)


_blank = functools.lru_cache(maxsize=8192)(_is_blank)


@functools.cache
def _leading_blanks() -> re.Pattern[str]:
    """Matches a run of blank characters (those of the Basic Multilingual Plane and the
    astral Default_Ignorable ranges): skips the bulk of a long blank start in C; the
    character loop handles whatever it leaves."""
    spans: list[list[int]] = [[ord(ch), ord(ch)] for ch in _BLANK_EXTRA]
    spans += [[lo, hi] for lo, hi in _DEFAULT_IGNORABLE]
    category = unicodedata.category
    for cp in range(0x10000):
        if category(chr(cp)) in _BLANK_CATEGORIES:
            if spans[-1][1] == cp - 1:
                spans[-1][1] = cp
            else:
                spans.append([cp, cp])
    return re.compile("[" + "".join(
        f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in spans) + "]*")


def _seen(text: str) -> Iterator[str]:
    """The characters of ``text`` as a reader takes them: each NFKC-normalised, casefolded
    and with lookalike letters folded, blanks dropped. Lazy, so a check reads only a head."""
    for raw in text:
        if not _blank(raw):
            yield from _fold(raw)


@functools.lru_cache(maxsize=8192)
def _fold(raw: str) -> str:
    folded = unicodedata.normalize("NFKC", raw).translate(_LOOKALIKE_UPPER).casefold()
    return "".join(ch for ch in folded.translate(_LOOKALIKE) if not _blank(ch))


def looks_like_source_line(text: str) -> bool:
    """True when ``text`` could pass for a source line: after blanks, a run of up to 32
    punctuation and symbol characters holding at least one opener (``[``, a lookalike
    bracket or quote), then the word "harness" in any case or compatibility form, blanks
    inside it allowed."""
    opener = False
    matched = 0
    lead = 0
    start = _leading_blanks().match(text)
    for ch in _seen(text[start.end() if start else 0:]):
        if matched == 0 and ch != _WORD[0]:
            lead += 1
            if lead > _MAX_LEAD or not unicodedata.category(ch).startswith(("P", "S")):
                return False
            opener = opener or ch in _OPENER_EXTRA or (
                unicodedata.category(ch) in _OPENER_CATEGORIES)
            continue
        if ch != _WORD[matched]:
            return False
        matched += 1
        if matched == len(_WORD):
            return opener
    return False


def user_display_prefix(text: str, user_name: str) -> str | None:
    """The prefix a user's message gets when its text could pass for a source line.

    Errs towards a prefix: an innocent message that starts like a label shows the user's
    name, a forged one never passes for a harness input (see ``looks_like_source_line``).
    """
    if text.lstrip().startswith(HARNESS_PREFIX) or looks_like_source_line(text):
        return f"{user_name}:"
    return None


class RecordRow(BaseModel):
    """One row of the conversation of record, as context assembly needs it. Frozen: a
    worker shares one row between the windows it reads (activities.row_cache); a changed
    row is a copy (`model_copy(update=...)`)."""

    model_config = ConfigDict(frozen=True)

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

    def attachment_lines(self) -> list[str]:
        """The line naming each file the message carried ([] for most rows)."""
        return with_lines("", attachments_of(self.content)).splitlines()

    def text_with_attachments(self) -> str:
        """The words, and below them the line of each file sent with them: what the memo and
        the record's tools show of a message (its files' bytes stay in the record)."""
        return with_lines(self.text, attachments_of(self.content))


class ToolCall(BaseModel):
    id: str
    name: str
    input_preview: str = ""  # the call's input as compact JSON, cut: for the event stream
    # The call's input as the model gave it (for routing, schema checks and approvals).
    input: dict[str, Any] = Field(default_factory=dict)


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    # Of the cache writes, those kept an hour (billed higher; schemas.cache_ttl).
    cache_creation_1h_input_tokens: int = 0

    @property
    def context_tokens(self) -> int:
        return self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens


# Of a reply's text, what a workflow task carries (in the model call's result and the
# turn's outcome); the record holds it whole.
REPLY_INLINE_CHARS = 16_000


def inline_reply(text: str) -> str:
    """The part of a reply's text that travels through the workflow."""
    return text[:REPLY_INLINE_CHARS]


# The API's stop reasons that mean the reply is not the whole answer, and what to tell
# the person (the reply itself is kept as the model wrote it).
_STOP_NOTES = {
    "max_tokens": "the reply stops at the output limit (max_output_tokens): ask it to go on, "
                  "or raise the limit",
    "model_context_window_exceeded": "the reply stops where the model's context window "
                                     "ended: ask it to go on",
    "refusal": "the model declined to answer this",
}


def stop_note(stop_reason: str | None) -> str | None:
    """What a person should know of a reply that stopped for `stop_reason`, or None when
    the reply is whole (`end_turn`, `tool_use`, a stop sequence)."""
    return _STOP_NOTES.get(stop_reason or "")


class ModelReply(BaseModel):
    """What the model-call activity returns: small, never the conversation."""

    seq: int
    stop_reason: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    # The final text of this reply, its first REPLY_INLINE_CHARS (a caller reads the rest
    # from the record, `Handler.READ_REPLY`); `text_chars` is the whole text's length.
    text: str = ""
    text_chars: int = 0
    reply_tokens: int = 0
    model: str = ""
    cost_usd: float = 0.0  # the usage at the worker's price for the model (schemas.budget)
    interrupted: bool = False  # stopped by a new message; `text` is what streamed
