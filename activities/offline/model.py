"""Keel's offline model: deterministic, no network, and it says so in every reply.

It answers Messages API requests by rule so that Keel's main job runs with no API key:
it works through a pull-request queue in the workspace (read the next PR, write a review,
report), and it writes real checkpoints: it reads the two checkpoint files, edits the mind
with exact replacements, ticks the memo, and writes the now. Its only memory is the
request it is given, so a queue position that a checkpoint loses is visibly lost.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from activities.offline.rollup import respond as rollup_respond
from activities.offline.tools import next_step
from schemas.checkpoint.mind import MindDocument
from schemas.checkpoint.request import MEMO_FILE, MIND_FILE, UNCHANGED_FILE_NOTE
from schemas.checkpoint.request import REQUEST_MARKER as CHECKPOINT_MARKER
from schemas.model import OFFLINE_MODEL_NAME
from schemas.tokens import count_tokens

NAME = OFFLINE_MODEL_NAME
TAG = "[offline model]"
MEMORY_FENCE = "<memory-context"

_ids = itertools.count(1)
_REVIEWED = re.compile(r"(?:[Rr]eviewed(?: through)? PR #|reviewed PRs #\d+ to #)(\d+)")
_NEEDS_DECISION = re.compile(r"PR #(\d+) needs your decision")
_KEEP_WORDS = re.compile(
    r"\b(only|never|always|don't|do not|must|prefer|interrupt|allowed|may not|approve|"
    r"approved|reject|instead|stop|priority|deadline|permission|oldest|queue)\b", re.I)
_DECISION_ON = re.compile(r"decision on PR #(\d+)")
_APPROVAL = re.compile(r"\b(approved?|go ahead)\b", re.I)
_MOVE_ALONG = re.compile(r"^\s*(continue|go on|next|ok|okay|yes|thanks?)[.!]?\s*$", re.I)


# ----- request reading ------------------------------------------------------------------

def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _texts(message: dict[str, Any]) -> list[str]:
    """The message's texts, without recalled long memory: a <memory-context> block is
    reference from other sessions, never this session's own progress."""
    out = []
    for b in _blocks(message):
        if b.get("type") == "text":
            out.append(str(b.get("text", "")))
        elif b.get("type") == "tool_result":
            c = b.get("content")
            out.append(c if isinstance(c, str) else " ".join(
                str(x.get("text", "")) for x in c or [] if isinstance(x, dict)))
    return [t for t in out if not t.lstrip().startswith(MEMORY_FENCE)]


def _all_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(t for m in messages for t in _texts(m))


def _user_inputs(messages: list[dict[str, Any]]) -> list[str]:
    """Text blocks of user turns that a person typed (no source line, not Keel's frame)."""
    out = []
    for m in messages:
        if m.get("role") != "user":
            continue
        for b in _blocks(m):
            text = str(b.get("text", "")) if b.get("type") == "text" else ""
            if text and not text.startswith(("[Harness:", "<memory-context", "<keel",
                                             "# Checkpoint", "(The conversation")):
                if "recollection" not in text[:400]:
                    out.append(text)
    return out


def _message(content: list[dict[str, Any]], stop: str, request: dict[str, Any]) -> dict[str, Any]:
    # Usage is the API's count, left to whoever answers for the API: the offline backend
    # (activities.offline.accounting) or the fake Messages API the benchmarks put it behind.
    return {
        "id": f"msg_offline_{next(_ids)}", "type": "message", "role": "assistant",
        "model": NAME, "content": content, "stop_reason": stop, "stop_sequence": None,
        "usage": {"input_tokens": None, "output_tokens": None},
    }


def _text(text: str, request: dict[str, Any]) -> dict[str, Any]:
    return _message([{"type": "text", "text": f"{TAG} {text}"}], "end_turn", request)


def _tools(calls: list[tuple[str, dict[str, Any]]], request: dict[str, Any],
           note: str = "") -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": f"{TAG} {note}"}] if note else []
    content += [{"type": "tool_use", "id": f"toolu_offline_{next(_ids)}", "name": n,
                 "input": a} for n, a in calls]
    return _message(content, "tool_use", request)


def _tool_results_by_name(messages: list[dict[str, Any]]) -> list[tuple[str, dict, str, bool]]:
    """(tool name, input, result text, is_error) for each call, oldest first."""
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    out = []
    for m in messages:
        for b in _blocks(m):
            if b.get("type") == "tool_use":
                calls[b["id"]] = (b["name"], b.get("input") or {})
            elif b.get("type") == "tool_result" and b.get("tool_use_id") in calls:
                name, args = calls[b["tool_use_id"]]
                c = b.get("content")
                text = c if isinstance(c, str) else str(c)
                out.append((name, args, text, bool(b.get("is_error"))))
    return out


# ----- the queue agent ------------------------------------------------------------------

def reviewed_through(text: str) -> int | None:
    found = [int(n) for n in _REVIEWED.findall(text)]
    return max(found) if found else None


def _queue_start(text: str) -> int | None:
    found = re.findall(r"PR #(\d+)", text)
    return min(int(n) for n in found) if found else None


def awaiting_decision(text: str) -> int | None:
    """The PR put to the user for a decision and not reviewed since, if any."""
    asked = [int(n) for n in _NEEDS_DECISION.findall(text) + _DECISION_ON.findall(text)]
    done = reviewed_through(text)
    if asked and (done is None or max(asked) > done):
        return max(asked)
    return None


def _agent_turn(request: dict[str, Any]) -> dict[str, Any]:
    messages = request.get("messages", [])
    last = messages[-1] if messages else {"content": []}
    last_results = [b for b in _blocks(last) if b.get("type") == "tool_result"]
    everything = _all_text(messages)
    users = _user_inputs(messages)
    latest = users[-1] if users else ""
    declared = _declared_tools_turn(request, messages, latest)
    if declared is not None:
        return declared
    if last_results:
        return _after_tools(messages, everything, request)
    # Asked for by the person, a tool's output or the recollection: its own replies (which
    # offer the queue to anyone who says hello) do not start it.
    theirs = _all_text([m for m in messages if m.get("role") != "assistant"])
    if "queue" not in theirs.lower():
        preview = " ".join(latest.split())[:160]
        return _text(
            f"I am Keel's offline deterministic model (no network, no API key). I received: "
            f"\"{preview}\". I can work through the pull-request queue in queue.md; set "
            "ANTHROPIC_API_KEY for a real model.", request)
    pending = awaiting_decision(everything)
    if pending is not None and _APPROVAL.search(latest):
        said = " ".join(latest.split())[:200]
        return _tools([("write_file", {
            "path": f"reviews/{pending}.md",
            "content": f"# Review of PR #{pending}\n\nVerdict: approved by the user "
                       f"(their decision: \"{said}\").\n"})], request,
            f"You approved PR #{pending}; recording your decision.")
    if re.search(r"\b(stop|pause|hold)\b", latest, re.I) and "queue" not in latest.lower():
        return _text("Paused, as you asked. Say \"continue\" to resume the queue.", request)
    if "queue.md" not in " ".join(str(a) for _, a, _, _ in _tool_results_by_name(messages)) \
            and reviewed_through(everything) is None:
        return _tools([("read_file", {"path": "queue.md"})], request, "Reading the queue.")
    done = reviewed_through(everything)
    start = _queue_start(everything) or 1
    pr = (done + 1) if done is not None else start
    return _tools([("read_file", {"path": f"prs/{pr}.md"})], request,
                  f"Reviewing PR #{pr}, the oldest not yet reviewed.")


def _declared_tools_turn(request: dict[str, Any], messages: list[dict[str, Any]],
                         latest: str) -> dict[str, Any] | None:
    """The session's own tools, by rule (activities/offline/tools.py)."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"
                     and any(b.get("type") == "text" and latest and latest in
                             str(b.get("text", "")) for b in _blocks(m))), default=0)
    called = _tool_results_by_name(messages[last_user:])
    step = next_step(request, latest, called)
    if step is None:
        return None
    if isinstance(step, list):
        return _text("I called the session's tools in the order its instructions name "
                     "them:\n" + "\n".join(step), request)
    tool, args = step
    return _tools([(tool["name"], args)], request, f"Calling {tool['name']}.")


def _after_tools(messages: list[dict[str, Any]], everything: str,
                 request: dict[str, Any]) -> dict[str, Any]:
    name, args, text, is_error = _tool_results_by_name(messages)[-1]
    path = str(args.get("path", ""))
    if name == "read_file" and path == "queue.md":
        start = _queue_start(text) or 1
        return _tools([("read_file", {"path": f"prs/{start}.md"})], request,
                      f"The queue starts at PR #{start}.")
    match = re.match(r"prs/(\d+)\.md$", path)
    if name == "read_file" and match:
        pr = int(match.group(1))
        if is_error:
            return _text(f"The queue is done: there is no PR #{pr}. Reviewed through PR "
                         f"#{pr - 1}.", request)
        title = next((ln.strip("# ").strip() for ln in text.splitlines() if ln.strip()),
                     f"PR #{pr}")
        needs = "needs-decision: yes" in text.lower()
        verdict = "needs the user's decision" if needs else "approve: tests cover the change"
        return _tools([("write_file", {"path": f"reviews/{pr}.md",
                                       "content": f"# Review of PR #{pr}\n{title}\n\n"
                                                  f"Verdict: {verdict}.\n"})], request)
    match = re.match(r"reviews/(\d+)\.md$", path)
    if name == "write_file" and match:
        pr = int(match.group(1))
        if "approved by the user" in str(args.get("content", "")):
            return _text(f"Reviewed PR #{pr}: approved by you. Next: PR #{pr + 1}.", request)
        review = _tool_results_by_name(messages)
        pr_text = next((t for n, a, t, _ in reversed(review)
                        if a.get("path") == f"prs/{pr}.md"), "")
        if "needs-decision: yes" in pr_text.lower():
            return _text(f"PR #{pr} needs your decision: it changes a public contract. "
                         f"Reviewed PR #{pr - 1} and earlier; I stop here until you decide.",
                         request)
        return _text(f"Reviewed PR #{pr}: approve. {_review_notes(pr_text)}"
                     f"Next: PR #{pr + 1}.", request)
    if is_error:
        return _text(f"The tool {name} failed: {text}", request)
    return _text(f"Done ({name} {path}).", request)


def _review_notes(pr_text: str) -> str:
    """What a reviewer would say back: the change in a sentence, the files it touches."""
    summary = pr_text.split("## Summary", 1)[1] if "## Summary" in pr_text else ""
    sentences = " ".join(summary.split("##", 1)[0].split()).split(". ")
    gist = ". ".join(s for s in sentences[:2] if s).strip().rstrip(".")
    files = list(dict.fromkeys(re.findall(r"^diff --git a/(\S+)", pr_text, re.M)))[:4]
    parts = [f"{gist}." if gist else ""]
    if files:
        parts.append("Files: " + ", ".join(files) + ".")
    return " ".join(p for p in parts if p) + (" " if any(parts) else "")


# ----- the checkpoint turn --------------------------------------------------------------

def _instruction_index(messages: list[dict[str, Any]]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if any(CHECKPOINT_MARKER in t for t in _texts(messages[i])):
            return i
    return None


def _insert_after_heading(mind: str, heading: str, entry: str) -> tuple[str, str] | None:
    """(old, new) for an exact edit that adds `entry` under `heading` (after its guidance)."""
    lines = mind.split("\n")
    for i, line in enumerate(lines):
        if line.strip() == heading:
            j = i + 1
            if j < len(lines) and lines[j].startswith("_"):
                j += 1
            old = "\n".join(lines[i:j])
            return old, old + "\n" + entry
    return None


def _workstream_line(everything: str) -> str | None:
    done = reviewed_through(everything)
    if done is None:
        return None
    return (f"- PR review queue, oldest first: in progress; reviewed through PR #{done}; "
            f"next PR #{done + 1}.")


def _mind_edits(mind: str, messages: list[dict[str, Any]], everything: str) -> list[dict]:
    edits: list[dict[str, Any]] = []
    users = _user_inputs(messages[: _instruction_index(messages) or len(messages)])
    mission_body = mind.split("### Mission", 1)[-1].split("### Workstreams", 1)[0]
    if not re.search(r"^- ", mission_body, re.M) and users:
        first = " ".join(users[0].split())
        goal = first.split(". ")[0][:200]
        found = _insert_after_heading(mind, "### Mission", f"- {goal}")
        if found:
            edits.append({"path": MIND_FILE, "old_text": found[0], "new_text": found[1]})
    stream = _workstream_line(everything)
    if stream:
        current = re.search(r"^- PR review queue, oldest first:.*$", mind, re.M)
        if current:
            if current.group(0) != stream:
                edits.append({"path": MIND_FILE, "old_text": current.group(0),
                              "new_text": stream})
        else:
            found = _insert_after_heading(mind, "### Workstreams", stream)
            if found:
                edits.append({"path": MIND_FILE, "old_text": found[0], "new_text": found[1]})
    where = mind.split("## Where I stand", 1)[-1].split("## Goals", 1)[0]
    agreement = next((u for u in users if re.search(r"\binterrupt\b", u, re.I)), None)
    if agreement and "Agreement:" not in where:
        found = _insert_after_heading(mind, "## Where I stand",
                                      "- Agreement: report each review; ask the user only "
                                      "when a PR needs their decision (see the memo).")
        if found:
            edits.append({"path": MIND_FILE, "old_text": found[0], "new_text": found[1]})
    decisions = re.findall(r"PR #(\d+) needs your decision", everything)
    if decisions:
        # Recurring decisions fold into one principle with the latest case, so the section
        # stays the same size however many PRs go to the user.
        line = (f"- A PR that changes a public contract goes to the user for a decision "
                f"(latest: PR #{decisions[-1]}).")
        current = re.search(r"^- A PR that changes a public contract goes to the user.*$",
                            mind, re.M)
        if current is None:
            found = _insert_after_heading(mind, "## Key decisions", line)
            if found:
                edits.append({"path": MIND_FILE, "old_text": found[0], "new_text": found[1]})
        elif current.group(0) != line:
            edits.append({"path": MIND_FILE, "old_text": current.group(0), "new_text": line})
    return edits


_MIND_NOTE = re.compile(r"^mind (Where I stand|Goals|Key decisions|Lessons): (.+)$", re.M)
_HEADING_FOR = {"Where I stand": "## Where I stand", "Goals": "### Workstreams",
                "Key decisions": "## Key decisions", "Lessons": "## Lessons"}


def _note_edits(mind: str, everything: str) -> list[dict[str, Any]]:
    """A mind that grows: lines `mind <Section>: <text>` in what the work read (the memory
    benchmark's mature-mind fixture) are added to that section while it stays within 85%
    of the limit the instruction states, newest first."""
    tokens = MindDocument(text=mind).section_tokens()
    edits: list[dict[str, Any]] = []
    for section, heading in _HEADING_FOR.items():
        limit = re.search(rf"- {section} \(at most (\d+) tokens", everything)
        if limit is None:
            continue
        room = int(limit.group(1)) * 85 // 100 - tokens.get(section, 0)
        new: list[str] = []
        for text in reversed(list(dict.fromkeys(
                t for sec, t in _MIND_NOTE.findall(everything) if sec == section))):
            entry = f"- {text.strip()}"
            cost = count_tokens(entry) + 1
            if entry in mind or cost > room:
                continue
            new.append(entry)
            room -= cost
        found = _insert_after_heading(mind, heading, "\n".join(new)) if new else None
        if found:
            edits.append({"path": MIND_FILE, "old_text": found[0], "new_text": found[1]})
    return edits


def _memo_edits(checklist: str) -> list[dict[str, Any]]:
    """Keep what guides the work; release what only moved it along and the approval of one
    PR (done once that PR is reviewed). One edit per run of neighbouring lines it changes,
    as a careful editor would, so a long checklist costs few calls."""
    lines = checklist.splitlines()
    changed: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        match = re.match(r"^- \[([ x])\] #(\d+) (.*)$", line)
        if not match:
            continue
        text = match.group(3)
        keep = bool(_KEEP_WORDS.search(text)) and not _MOVE_ALONG.match(text) \
            and not _APPROVAL.match(text)
        box = "x" if keep else " "
        if match.group(1) != box:
            changed.append((i, f"- [{box}]" + line[5:]))
    edits: list[dict[str, Any]] = []
    run: list[tuple[int, str]] = []
    for i, new in [*changed, (-2, "")]:
        if run and i != run[-1][0] + 1:
            first, last = run[0][0], run[-1][0]
            edits.append({"path": MEMO_FILE, "old_text": "\n".join(lines[first:last + 1]),
                          "new_text": "\n".join(n for _, n in run)})
            run = []
        run.append((i, new))
    return edits


def _now_block(messages: list[dict[str, Any]], everything: str) -> str:
    users = _user_inputs(messages[: _instruction_index(messages) or len(messages)])
    explicit = [u for u in users if not _MOVE_ALONG.match(u)]
    latest = " ".join((explicit[-1] if explicit else (users[-1] if users else "")).split())
    done = reviewed_through(everything)
    pending = awaiting_decision(everything)
    waiting = [str(pending)] if pending is not None else []
    approvals = _approvals_waiting(everything)
    errors = [t for _, _, t, e in _tool_results_by_name(messages) if e][-1:]
    if done is not None:
        step = f"Review PR #{done + 1} (workstream: PR review queue, oldest first)."
        progress = (f"Done: reviewed through PR #{done}. In progress: PR #{done + 1}. "
                    f"Open: the rest of the queue in queue.md.")
        refs = f"queue.md; prs/{done + 1}.md; reviews/{done}.md"
    else:
        step = "Answer the user's latest request."
        progress = "Done: nothing recorded yet. In progress: the latest request."
        refs = "queue.md"
    lines = [
        "<checkpoint>",
        f"Current step: {step}",
        f"Progress: {progress}",
        "Waiting on: " + ("; ".join(approvals) if approvals else
                          f"the user's decision on PR #{waiting[-1]}." if waiting
                          else "nothing: no background command, Watch, Task, delegated run "
                               "or question is pending."),
        f"Next steps: continue as the user asked: \"{latest[:300]}\"",
        "Pitfalls: " + (f"last tool error: {errors[0][:200]}" if errors else "none seen."),
        f"Exact references: {refs}.",
        f"(Written by {NAME}, by rule.)",
        "</checkpoint>",
    ]
    return "\n".join(lines)


def _approvals_waiting(everything: str) -> list[str]:
    """Calls the record says wait on a person's approval and were not decided since."""
    from schemas.agent import DECIDED_NOTICE_TAG, WAIT_NOTICE_TAG

    waits = re.findall(re.escape(WAIT_NOTICE_TAG) + r" (\S+) \(call (\S+), (.*?)\) since (\S+);",
                       everything)
    decided = set(re.findall(re.escape(DECIDED_NOTICE_TAG) + r" call (\S+) ", everything))
    return [f"a person's approval of {tool} (call {call}, {what}) since {since}"
            for tool, call, what, since in waits if call not in decided]


def _as_read(text: str, path: Any, instruction: dict[str, Any]) -> str:
    """A read's text; a scratch file read back unchanged is the text the request shows."""
    if text != UNCHANGED_FILE_NOTE.format(path=path):
        return text
    shown = re.search(r'<file path="' + re.escape(str(path)) + r'">\n(.*?)\n</file>',
                      "\n".join(_texts(instruction)), re.S)
    return shown.group(1) if shown else ""


def _checkpoint_turn(request: dict[str, Any]) -> dict[str, Any]:
    messages = request.get("messages", [])
    start = _instruction_index(messages)
    assert start is not None
    after = messages[start:]
    everything = _all_text(messages[:start + 1])
    results = _tool_results_by_name(after)
    repair = any("repair" in t.lower() for t in _texts(messages[-1])) and not any(
        b.get("type") == "tool_result" for b in _blocks(messages[-1]))
    if (request.get("tool_choice") or {}).get("type") == "none":
        return _text(_now_block(messages, everything), request)
    reads = {a.get("path"): _as_read(t, a.get("path"), messages[start])
             for n, a, t, e in results if n == "read_file" and not e}
    edited = any(n == "edit_file" for n, _, _, _ in results)
    if repair or not (MIND_FILE in reads and MEMO_FILE in reads):
        return _tools([("read_file", {"path": MIND_FILE}), ("read_file", {"path": MEMO_FILE})],
                      request, "Reading the mind and the memo checklist.")
    if not edited:
        # The memo first: its edits are short, and a reply cut at max_tokens keeps them.
        edits = _memo_edits(reads[MEMO_FILE])
        edits += _mind_edits(reads[MIND_FILE], messages, everything)
        edits += _note_edits(reads[MIND_FILE], everything)
        if edits:
            return _tools([("edit_file", e) for e in edits], request,
                          "Editing the mind and ticking the memo.")
    return _text(_now_block(messages, everything), request)


def respond(request: dict[str, Any]) -> dict[str, Any]:
    """Answer one Messages API request (as a plain dict) with a response dict."""
    answer = rollup_respond(request)
    if answer is not None:
        return answer
    if _instruction_index(request.get("messages", [])) is not None:
        return _checkpoint_turn(request)
    return _agent_turn(request)
