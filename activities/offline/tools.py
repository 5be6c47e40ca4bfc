"""The offline model's rule for a session's declared tools (service, MCP and initiative tools):
it calls them in the order the session's instructions name them (each step the one after
the latest planned tool called), once per request, with
arguments filled from the tools' input schemas and the user's words, then reports what
each returned. Deterministic, no network; every text it writes says it is the offline model.

A tool the instructions do not name is never called. An argument is filled by rule: an
`*id*` string from the first id-like token (`A-1001`) in the user's message, `query` from
the topic words of the message, an amount from a number in an earlier tool result with the
same field name (else the first number in the message), booleans false, a choice (`enum`,
a delegate call's sub-agent) its first value; a `schedule_wakeup` (offered when the spec
opts in, schemas.initiative) comes after the delay the message names (a number with a unit
of time, else its first number, in seconds), with a note of its own. A tool is named by its
name as a word of its own: a sub-agent told its task was "delegated" is not told to call
`delegate`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from schemas.agent import BUILTIN_TOOL_NAMES

_ID = re.compile(r"\b[A-Z]{1,5}-\d+\b")
_NUMBER = re.compile(r"\b\d+\b")
_DELAY = re.compile(r"(?<![\d.])(\d+)\s*(s|secs?|seconds?|m|mins?|minutes?|h|hours?)\b", re.I)
_UNIT_S = {"s": 1, "m": 60, "h": 3600}
_TOPICS = ("refund", "shipping", "password", "support", "account")


def declared_tools(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in request.get("tools") or [] if t.get("name") not in BUILTIN_TOOL_NAMES]


def _mentions(system: str, name: str) -> int | None:
    """Where the instructions first name the tool (an MCP tool by its own name too)."""
    marker = "## Instructions for this session"
    at = system.find(marker)
    if at < 0:
        return None
    text = system[at:]
    names = [name] + ([name.split("__", 2)[2]] if name.startswith("mcp__") else [])
    # A name as a word of its own: a sub-agent's note that work was "delegated" to it
    # names no `delegate` call.
    found = [m.start() for n in names
             if (m := re.search(rf"(?<!\w){re.escape(n)}(?!\w)", text))]
    return min(found) if found else None


def planned(request: dict[str, Any]) -> list[dict[str, Any]]:
    system = request.get("system")
    if isinstance(system, list):
        system = "\n".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    system = str(system or "")
    named = [(i, t) for t in declared_tools(request)
             if (i := _mentions(system, t["name"])) is not None]
    return [t for _, t in sorted(named, key=lambda p: p[0])]


def _value(name: str, prop: dict[str, Any], user: str, results: list[str]) -> Any:
    kind = prop.get("type")
    lname = name.lower()
    if prop.get("enum"):  # a delegate call's sub-agent: the first named
        return prop["enum"][0]
    if kind == "string":
        if "id" in lname.split("_") or lname.endswith("id"):
            found = _ID.search(user)
            return found.group(0) if found else "unknown"
        if lname in ("query", "q", "search", "topic"):
            words = [t for t in _TOPICS if t in user.lower()]
            return " ".join(words[:1]) or " ".join(user.split()[:3])
        return " ".join(user.split())[:200]
    if kind in ("integer", "number"):
        for text in reversed(results):
            match = re.search(rf'"{re.escape(name)}"\s*:\s*(\d+)', text)
            if match:
                return int(match.group(1))
        first = _first_number(user)
        return 0 if first is None else first
    if kind == "boolean":
        return False
    return None


def delay_s(user: str) -> int:
    """The delay the person asked for, in seconds: the first number with a unit of time
    ("in 3 seconds", "in 2 min"; a version number is none), else the first number, else a
    minute."""
    if found := _DELAY.search(user):
        return int(found.group(1)) * _UNIT_S[found.group(2)[0].lower()]
    first = _first_number(user)
    return 60 if first is None else first


def _first_number(user: str) -> int | None:
    """The first number of the person's words that is not part of an id (`A-1001`)."""
    found = _NUMBER.search(_ID.sub("", user))
    return int(found.group(0)) if found else None


def arguments(tool: dict[str, Any], user: str, results: list[str]) -> dict[str, Any]:
    schema = tool.get("input_schema") or {}
    props: dict[str, Any] = schema.get("properties") or {}
    out: dict[str, Any] = {}
    for name in schema.get("required") or list(props):
        value = _value(name, props.get(name) or {}, user, results)
        if value is not None:
            out[name] = value
    if tool.get("name") == "schedule_wakeup":  # after the delay the person gave
        out["after_s"] = delay_s(user)
        # Its own words, not the person's: a wakeup's Task is not the person asking again.
        out["note"] = "[offline model] look again, as the person asked"
    return out


def next_step(request: dict[str, Any], user: str,
              called: list[tuple[str, dict[str, Any], str, bool]]
              ) -> tuple[dict[str, Any], dict[str, Any]] | list[str] | None:
    """The next (tool, input) to call for this request; or, when every planned tool has
    been called, the report's lines; None when there are no declared tools to plan."""
    plan = planned(request)
    if not plan:
        return None
    # The step after the latest planned tool called: a checkpoint may have moved earlier
    # calls out of the window, and a finished plan is never started again.
    names = [t["name"] for t in plan]
    latest = next((names.index(n) for n, _, _, _ in reversed(called) if n in names), -1)
    if latest + 1 < len(plan):
        tool = plan[latest + 1]
        return tool, arguments(tool, user, [t for _, _, t, _ in called])
    lines = []
    for name, args, text, is_error in called:
        shown = " ".join(text.split())[:240]
        verdict = "failed" if is_error else "returned"
        lines.append(f"- {name}({json.dumps(args, ensure_ascii=False)}) {verdict}: {shown}")
    return lines
