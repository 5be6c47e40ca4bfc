"""What the pages show, computed without I/O: the mind diff, the record as a conversation,
the context gauge.

Invariants: nothing here builds HTML (the templates do, with autoescape on, so text with
markup in it is shown, never rendered); a Mission entry's status change is recognised by
the mind's own rule (`schemas.checkpoint.mind.mission_entry_core`), not a second copy.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from keel.record import RecordEntry
from schemas.attachments import attachments_of
from schemas.checkpoint.mind import mission_entry_core
from schemas.session import SessionStatus, SessionSummary


@dataclass(frozen=True)
class DiffLine:
    op: str  # same | added | removed | status (a Mission entry whose status changed)
    text: str
    old: str = ""  # for "status": the line before
    mission: bool = False  # the line is a Mission entry


def _mission_lines(lines: list[str]) -> set[int]:
    """Indices of the list items under the `### Mission` heading."""
    inside = False
    out: set[int] = set()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("#"):
            inside = stripped.lstrip("#").strip().casefold() == "mission"
            continue
        if inside and stripped.startswith(("- ", "* ", "+ ")):
            out.add(i)
    return out


def mind_diff(previous: str, current: str) -> list[DiffLine]:
    """The mind line by line against the previous checkpoint's ("" for the first one)."""
    old, new = previous.splitlines(), current.splitlines()
    old_mission, new_mission = _mission_lines(old), _mission_lines(new)
    out: list[DiffLine] = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            out += [DiffLine("same", new[j], mission=j in new_mission) for j in range(j1, j2)]
            continue
        removed = list(range(i1, i2))
        added = list(range(j1, j2))
        # A Mission entry that keeps its words with another status mark: one "status" line.
        pairs: dict[int, int] = {}
        for j in added:
            if j not in new_mission:
                continue
            core = mission_entry_core(new[j])
            for i in removed:
                if i in old_mission and i not in pairs.values() and (
                        mission_entry_core(old[i]) == core):
                    pairs[j] = i
                    break
        out += [DiffLine("removed", old[i], mission=i in old_mission)
                for i in removed if i not in pairs.values()]
        for j in added:
            if j in pairs:
                out.append(DiffLine("status", new[j], old=old[pairs[j]], mission=True))
            else:
                out.append(DiffLine("added", new[j], mission=j in new_mission))
    return out


@dataclass(frozen=True)
class SessionRow:
    """One line of the sessions list, from a status query or from `list_sessions()`."""

    id: str
    phase: str
    turn: int | None
    context: str  # "5,567 / 10,000" or "" when unknown
    context_pct: float | None
    checkpoints: int
    last_activity: str
    temporal: str | None

    @classmethod
    def from_status(cls, session_id: str, status: SessionStatus | None,
                    last_at: datetime | None, checkpoints: int, temporal: str | None
                    ) -> SessionRow:
        when = last_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if last_at else ""
        if status is None:
            return cls(session_id, "unknown", None, "", None, checkpoints, when, temporal)
        return cls(session_id, status.phase.value, status.turn,
                   f"{status.context_tokens:,} / {status.context_window:,}",
                   100 * status.context_tokens / max(1, status.context_window),
                   status.checkpoint_count, when, temporal)

    @classmethod
    def from_summary(cls, summary: SessionSummary, temporal: str | None) -> SessionRow:
        return cls(summary.session_id, summary.phase or "unknown", summary.turn, "",
                   summary.context_percent, summary.checkpoints, summary.last_activity,
                   temporal)


@dataclass(frozen=True)
class Gauge:
    tokens: int
    threshold: int
    window: int

    @property
    def used_pct(self) -> float:
        return min(100.0, 100 * self.tokens / max(1, self.window))

    @property
    def threshold_pct(self) -> float:
        return min(100.0, 100 * self.threshold / max(1, self.window))


@dataclass(frozen=True)
class ShownFile:
    """A file a message carried (a user's attachment, a tool's image), as the page links
    it: `/sessions/{id}/files/{seq}/{index}`."""

    seq: int
    index: int
    name: str
    media_type: str

    @property
    def is_image(self) -> bool:
        return self.media_type.startswith("image/")


def files_of(seq: int, content: Any) -> list[ShownFile]:
    return [ShownFile(seq, i, str(item.get("name", "")), str(item.get("media_type", "")))
            for i, item in enumerate(attachments_of(content))]


@dataclass
class ToolUse:
    tool_use_id: str
    name: str
    input: str
    result: str | None = None
    is_error: bool = False
    result_seq: int | None = None
    result_files: list[ShownFile] = field(default_factory=list)


@dataclass
class Shown:
    """One message of the record as the conversation shows it."""

    seq: int
    type: str
    text: str
    source_line: str | None
    token_count: int
    turn: int | None
    tools: list[ToolUse] = field(default_factory=list)
    folded_into: int | None = None  # a tool result shown under its call's message
    rewound: bool = False  # a rewind abandoned it: shown, struck through, never sent again
    origin: str | None = None  # "session #seq" a fork copied it from
    files: list[ShownFile] = field(default_factory=list)


def conversation(rows: list[RecordEntry]) -> list[Shown]:
    """The rows with each tool call's result folded under the assistant message that made
    it (when both are on the page); a result whose call is not on the page stays a row."""
    shown: list[Shown] = []
    calls: dict[str, ToolUse] = {}
    for row in rows:
        item = Shown(seq=row.seq, type=row.type, text=row.shown_text,
                     source_line=row.source_line,
                     token_count=row.token_count, turn=row.turn,
                     rewound=row.rewound_by is not None,
                     origin=f"{row.origin_session} #{row.origin_seq}"
                     if row.origin_session else None, files=files_of(row.seq, row.content))
        if row.type == "assistant" and isinstance(row.content, list):
            for block in row.content:
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    use = ToolUse(tool_use_id=str(block.get("id", "")),
                                  name=str(block.get("name", "")),
                                  input=json.dumps(block.get("input", {}), ensure_ascii=False,
                                                   indent=1)[:4_000])
                    item.tools.append(use)
                    calls[use.tool_use_id] = use
        if row.type == "tool_result" and isinstance(row.content, dict):
            use_id = str(row.content.get("tool_use_id", ""))
            if use_id in calls:
                call = calls[use_id]
                call.result, call.is_error = row.text, bool(row.content.get("is_error"))
                call.result_seq, call.result_files = row.seq, item.files
                continue
        shown.append(item)
    return shown

