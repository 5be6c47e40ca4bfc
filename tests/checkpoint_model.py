"""A fake model for checkpoint tests: ordinary turns answer briefly; the checkpoint turn is
answered by a per-test behaviour that sees the round number, whether the repair request
came, and the two files' text as the instruction shows them."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from schemas.checkpoint.request import MEMO_FILE as MEMO
from schemas.checkpoint.request import MIND_FILE as MIND
from schemas.checkpoint.request import REQUEST_MARKER as MARKER
from tests.fake_anthropic import text_message, tool_use_message

REPAIR = "[Keel: checkpoint repair]"


def texts(message: dict[str, Any]) -> list[str]:
    content = message["content"]
    if isinstance(content, str):
        return [content]
    out = []
    for b in content:
        if b.get("type") == "text":
            out.append(b["text"])
        elif b.get("type") == "tool_result":
            out.append(b["content"] if isinstance(b["content"], str) else str(b["content"]))
    return out


@dataclass
class CheckpointTurn:
    round: int  # 0-based, counting the repair's rounds on after the turn's
    repair: bool  # this request carries the repair request
    repaired: bool  # the repair request came at some point
    mind: str
    checklist: str
    body: dict[str, Any]
    final_only: bool  # tool_choice none: the last request, for the now alone


def now_block(extra: str = "") -> str:
    return ("<checkpoint>\nCurrent step: keep going with the user's request (workstream: "
            "main). Progress: done: the early part; in progress: the rest. Waiting on: "
            "nothing. Next steps: continue as asked. Pitfalls: none. Exact references: "
            f"notes.md.{extra}\n</checkpoint>")


def edit(path: str, old: str, new: str) -> tuple[str, dict[str, Any]]:
    return ("edit_file", {"path": path, "old_text": old, "new_text": new})


def add_mission(mind: str, entry: str) -> tuple[str, dict[str, Any]]:
    heading = next(line for line in mind.splitlines() if line.startswith("### Mission"))
    guide = mind.split(heading + "\n", 1)[1].split("\n", 1)[0]
    return edit(MIND, f"{heading}\n{guide}", f"{heading}\n{guide}\n- {entry}")


def tick(checklist: str, seq: int) -> tuple[str, dict[str, Any]]:
    line = next(ln for ln in checklist.splitlines() if ln.startswith(f"- [ ] #{seq} "))
    return edit(MEMO, line, line.replace("- [ ]", "- [x]", 1))


def release(checklist: str, seq: int) -> tuple[str, dict[str, Any]]:
    line = next(ln for ln in checklist.splitlines() if ln.startswith(f"- [x] #{seq} "))
    return edit(MEMO, line, line.replace("- [x]", "- [ ]", 1))


def listed(checklist: str) -> list[int]:
    """The message numbers the checklist lists, in order."""
    return [int(m) for m in re.findall(r"^- \[[ x]\] #(\d+) ", checklist, re.M)]


def tick_all(checklist: str) -> list[tuple[str, dict[str, Any]]]:
    """Tick whatever is unticked (candidates come ticked: usually nothing)."""
    return [tick(checklist, int(m)) for m in re.findall(r"^- \[ \] #(\d+) ", checklist, re.M)]


@dataclass
class CheckpointModel:
    behaviour: Callable[[CheckpointTurn], dict[str, Any]]
    ordinary: Callable[[dict[str, Any]], dict[str, Any]] = field(
        default=lambda body: text_message("noted"))
    checkpoint_requests: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        start = next((i for i in range(len(messages) - 1, -1, -1)
                      if any(MARKER in t for t in texts(messages[i]))), None)
        if start is None:
            return self.ordinary(body)
        self.checkpoint_requests.append(body)
        instruction = next(t for t in texts(messages[start]) if MARKER in t)
        files = dict(re.findall(r'<file path="([^"]+)">\n(.*?)\n</file>', instruction, re.S))
        after = messages[start + 1:]
        rounds = sum(1 for m in after if m["role"] == "assistant")
        last = texts(messages[-1])
        return self.behaviour(CheckpointTurn(
            round=rounds, repair=any(REPAIR in t for t in last),
            repaired=any(REPAIR in t for m in after for t in texts(m)),
            mind=files.get(MIND, ""), checklist=files.get(MEMO, ""), body=body,
            final_only=(body.get("tool_choice") or {}).get("type") == "none"))


def good_checkpoint(turn: CheckpointTurn) -> dict[str, Any]:
    """A valid checkpoint in two rounds: edit the mind and keep only the first message (the
    others released), then the now."""
    if turn.round == 0:
        calls = [add_mission(turn.mind, "Finish the user's long job")]
        calls += [release(turn.checklist, seq) for seq in listed(turn.checklist)[1:]]
        return tool_use_message(calls)
    return text_message("Checkpoint written.\n" + now_block())
