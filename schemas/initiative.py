"""The agent's own initiative, as pure rules: the wakeups it schedules and the sub-agents it
delegates to. No I/O, no clock: `now` is always passed in (`workflow.now()` in workflow code).

Invariants:
- The spec opts in: a session offers `schedule_wakeup` / `list_wakeups` / `cancel_wakeup`
  only when its spec has `wakeups` limits, and `delegate` only when it declares sub-agents
  (`initiative_tools`); a session without them sends the model the same tools as before.
- A refused schedule is a `WakeupRefused` whose text the model reads as the tool's error
  result: exactly one of `at` / `after_s` / `cron` / `every_s`, within the spec's limits
  (how many at once, the shortest interval, the expiry, at most `MAX_EXPIRY_S`).
- A recurring wakeup is at least `RECURRING_FLOOR_S` apart whatever the spec allows:
  Temporal's scheduler works to the second (its own words), and a 1 s interval's starts
  fell behind by ~20 ms a fire until one was skipped (dev server 1.32; at 2 s and 3 s they
  were 20-70 ms late, the first fire too). An interval's fires are
  `interval_start(created) + k * every_s` (k >= 1: `interval_offset`), its creation up to
  the whole second (Temporal drops an offset's fraction of a second), so the first comes
  a whole interval after it was scheduled, within a second more.
- A cron expression is five fields (minute hour day-of-month month day-of-week, UTC), read
  here strictly (`parse_cron`): the next fire and the shortest gap are computed from it, so
  the shortest-interval limit holds for cron as for `every_s`.
- A sub-agent is a subset of its parent: its built-in and service tools are among the
  parent's, its memory scope is the parent's or a narrower one (`<parent>.<name>`), its
  timeout at most the parent's limit. `sub_agent_problems` lists every breach.
- A wakeup's source line is written from its id and note by Keel
  (`schemas.messages.wakeup_source_line`), never from the text, so it cannot pass for the
  user.

These models travel in workflow state: add fields only as optional with defaults.
"""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field

from schemas.attachments import Attachment
from schemas.strict import SpecModel

__all__ = [
    "DEFAULT_EXPIRY_S",
    "DELEGATE_TOOL",
    "INITIATIVE_TOOL_NAMES",
    "MAX_EXPIRY_S",
    "RECURRING_FLOOR_S",
    "WAKEUP_TOOLS",
    "ChildRun",
    "CronSpec",
    "DelegatedTask",
    "DelegationLimits",
    "SubAgent",
    "Wakeup",
    "WakeupLimits",
    "WakeupRefused",
    "WakeupSignal",
    "child_scope",
    "child_session_id",
    "cron_min_gap_s",
    "initiative_tools",
    "interval_offset",
    "interval_schedule_start",
    "interval_start",
    "next_cron_fire",
    "parse_cron",
    "plan_wakeup",
    "sub_agent_problems",
    "wakeup_listing",
]

DEFAULT_EXPIRY_S = 7 * 86_400
MAX_EXPIRY_S = 90 * 86_400
MAX_WAKEUP_NOTE_CHARS = 500
RECURRING_FLOOR_S = 2.0
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,40}$")


class WakeupLimits(SpecModel):
    """What the agent may schedule: how many at once, how often, for how long."""

    max_active: int = Field(default=10, ge=1, le=100)
    min_interval_s: float = Field(default=60.0, ge=1)  # also the earliest one-shot delay
    expiry_s: float = Field(default=DEFAULT_EXPIRY_S, gt=0, le=MAX_EXPIRY_S)


class SubAgent(SpecModel):
    """A sub-agent the session may delegate to: a child session of its own."""

    name: str
    description: str = ""
    instructions: str = ""
    model: str | None = None
    builtin_tools: list[str] | None = None  # None: the parent's
    tools: list[str] | None = None  # the parent's service tools it gets; None: all of them
    memory_scope: str | None = None  # None: the parent's; else `<parent scope>.<suffix>`
    timeout_s: float = Field(default=600.0, gt=0, le=86_400)


class DelegationLimits(SpecModel):
    max_depth: int = Field(default=2, ge=1, le=5)  # a child of a child of ... this deep
    max_children: int = Field(default=4, ge=1, le=50)  # children answering at once


class Wakeup(BaseModel):
    """One scheduled wakeup, in the session's state."""

    id: str
    note: str
    created: datetime
    expires: datetime
    due: datetime | None = None  # a one-shot: when it fires
    cron: str | None = None  # a recurring one: a cron expression (UTC) ...
    every_s: float | None = None  # ... or an interval
    fired: int = 0
    schedule_id: str | None = None  # the Temporal Schedule of a recurring one
    # The assistant row whose call scheduled it: a rewind to before it cancels it.
    seq: int | None = None

    @property
    def recurring(self) -> bool:
        return self.due is None


class WakeupSignal(BaseModel):
    """What a recurring wakeup's schedule signals to its session."""

    wakeup_id: str
    fire_time: datetime | None = None  # the schedule's time for this fire


class DelegatedTask(BaseModel):
    """A child session's link to its parent (`SessionConfig.delegated`)."""

    parent_session: str
    call_id: str  # the parent's delegate call
    agent: str
    task: str
    depth: int = 1
    # How the child answers: by signal (any parent, one that continued as new too), or in
    # its run's result, which a parent whose call waits for it hears from the child
    # workflow's completion (no signal, no workflow task more on either side).
    answer_in_result: bool = False
    # The parent hears `Handler.CHILD_ANSWER`, so the child's final model call may tell it
    # the answer. False from a parent on code before that signal (a rolling deploy): it
    # would take the signal for an unknown one, so the child answers at its end only.
    hears_call: bool = False
    # Files of the parent's workspace given with the task (the call's `files`), copied to
    # the child's workspace at the same paths: the child's task carries them.
    files: list[Attachment] = Field(default_factory=list)
    # The call's `bring_back`: patterns of the files it wrote that go home with its answer
    # (schemas.delegation.brought); None: every one.
    bring_back: list[str] | None = None


class ChildRun(BaseModel):
    """A child a session delegated to, in the parent's state."""

    session_id: str
    agent: str
    call_id: str
    started: datetime
    deadline: datetime
    wait: bool = True
    done: str | None = None  # "answered", "failed", "timed out", "ended"
    # Started by the parent's model call (activities.delegate_ahead), not as a Temporal
    # child: its parent asks now and then whether it closed without answering.
    ahead: bool = False
    # The assistant row whose delegate call started it: a rewind to before it ends it.
    seq: int | None = None


class WakeupRefused(ValueError):
    """A schedule the limits refuse; its text is the tool's error result."""


WAKEUP_TOOLS: list[dict[str, Any]] = [
    {"name": "schedule_wakeup",
     "description": "Schedule a wakeup for your future self: at a time (ISO 8601, UTC), "
                    "after a delay in seconds, or recurring (a 5-field cron expression in "
                    "UTC, or every N seconds). When it fires, the note arrives as a Task "
                    "input from Keel (not from the user).",
     "input_schema": {"type": "object", "properties": {
         "note": {"type": "string"}, "at": {"type": "string"},
         "after_s": {"type": "number"}, "cron": {"type": "string"},
         "every_s": {"type": "number"}, "expires_in_s": {"type": "number"}},
         "required": ["note"]}},
    {"name": "list_wakeups", "description": "List the wakeups scheduled now.",
     "input_schema": {"type": "object", "properties": {}}},
    {"name": "cancel_wakeup", "description": "Cancel a scheduled wakeup by its id.",
     "input_schema": {"type": "object", "properties": {"id": {"type": "string"}},
                      "required": ["id"]}},
]
DELEGATE_TOOL: dict[str, Any] = {
    "name": "delegate",
    "description": "Hand a task to a sub-agent: a child session that works on it alone and "
                   "answers once. wait=true (the default) pauses this call until it "
                   "answers; wait=false goes on, and the answer arrives later as an agent "
                   "run input. The files it writes are copied to your workspace with its "
                   "answer, which names them (bring_back: only those matching these "
                   "patterns; the rest stay in its workspace).",
    "input_schema": {"type": "object", "properties": {
        "agent": {"type": "string"}, "task": {"type": "string"},
        "wait": {"type": "boolean"},
        "files": {"type": "array", "items": {"type": "string"}, "maxItems": 20,
                  "description": "Paths of files in your workspace (images, PDFs, text) "
                                 "the sub-agent gets with its task."},
        "bring_back": {"type": "array", "items": {"type": "string"}, "maxItems": 20,
                       "description": "Patterns of the paths it writes to copy back, like "
                                      "\"report.md\" or \"*.png\" (default: all)."}},
        "required": ["agent", "task"]},
}
INITIATIVE_TOOL_NAMES = frozenset({t["name"] for t in WAKEUP_TOOLS} | {"delegate"})


def initiative_tools(wakeups: WakeupLimits | None,
                     sub_agents: list[SubAgent]) -> list[dict[str, Any]]:
    """The tools a spec opts into, after the built-ins (the delegate tool names its
    sub-agents in its schema)."""
    out = [dict(t) for t in WAKEUP_TOOLS] if wakeups is not None else []
    if sub_agents:
        tool = dict(DELEGATE_TOOL)
        schema = {**tool["input_schema"], "properties": {
            **tool["input_schema"]["properties"],
            "agent": {"type": "string", "enum": [a.name for a in sub_agents]}}}
        lines = "; ".join(f"{a.name}: {a.description or a.instructions[:120]}"
                          for a in sub_agents)
        out.append({**tool, "input_schema": schema,
                    "description": f"{tool['description']} Sub-agents: {lines}"})
    return out


# ----- cron ----------------------------------------------------------------------------

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12),
           ("day of week", 0, 6))


class CronSpec(BaseModel):
    minutes: list[int]
    hours: list[int]
    days: list[int]
    months: list[int]
    weekdays: list[int]  # 0 = Sunday
    any_day: bool  # day of month is *
    any_weekday: bool  # day of week is *


def _field(text: str, name: str, low: int, high: int) -> list[int]:
    values: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        # isdecimal, not isdigit: "²" is a digit that int() refuses (a ValueError, not a
        # refusal, took the session's workflow task down).
        if (step_text and not step_text.isdecimal()) or step_text == "0":
            raise WakeupRefused(f"cron {name}: step {step_text!r} is not a positive number")
        step = int(step_text) if step_text else 1
        if base == "*":
            start, end = low, high
        elif re.fullmatch(r"\d+-\d+", base):
            start, end = (int(x) for x in base.split("-"))
        elif base.isdecimal():
            start = int(base)
            end = high if step_text else start
        else:
            raise WakeupRefused(f"cron {name}: {part!r} is not a number, range or *")
        if name == "day of week" and end == 7:  # 7 is Sunday too
            values.add(0)
            if start == 7:
                continue
            end = 6
        if not (low <= start <= end <= high):
            raise WakeupRefused(f"cron {name}: {part!r} is outside {low}-{high}")
        values.update(range(start, end + 1, step))
    return sorted(values)


def parse_cron(expr: str) -> CronSpec:
    """A five-field cron expression, or WakeupRefused naming the field that is wrong."""
    parts = expr.split()
    if len(parts) != 5:
        raise WakeupRefused(f"cron {expr!r} must have five fields (minute hour day-of-month "
                            f"month day-of-week), not {len(parts)}")
    got = [_field(p, *spec) for p, spec in zip(parts, _FIELDS, strict=True)]
    return CronSpec(minutes=got[0], hours=got[1], days=got[2], months=got[3],
                    weekdays=got[4], any_day=parts[2] == "*", any_weekday=parts[4] == "*")


def _day_matches(spec: CronSpec, day: datetime) -> bool:
    if day.month not in spec.months:
        return False
    dom, dow = day.day in spec.days, (day.isoweekday() % 7) in spec.weekdays
    if spec.any_day or spec.any_weekday:  # one restricted: that one decides
        return dom and dow
    return dom or dow  # both restricted: either (cron's rule)


def next_cron_fire(spec: CronSpec, after: datetime) -> datetime | None:
    """The first fire strictly after `after` (UTC), within five years; None if none."""
    after = after.astimezone(UTC)
    day = after.replace(hour=0, minute=0, second=0, microsecond=0)
    for _ in range(5 * 366):
        if _day_matches(spec, day):
            for hour in spec.hours:
                for minute in spec.minutes:
                    at = day.replace(hour=hour, minute=minute)
                    if at > after:
                        return at
        day += timedelta(days=1)
    return None


def cron_min_gap_s(spec: CronSpec, start: datetime, fires: int = 60) -> float | None:
    """The shortest gap between the next `fires` fires after `start` (None: fewer than
    two fires)."""
    times: list[datetime] = []
    at = next_cron_fire(spec, start)
    while at is not None and len(times) < fires:
        times.append(at)
        at = next_cron_fire(spec, at)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    return min(gaps) if gaps else None


# ----- planning a wakeup ---------------------------------------------------------------

# A delay or period past this is no wakeup (and a datetime past year 9999 cannot be made).
MAX_WAKEUP_SECONDS = 100 * 366 * 86_400


def _number(args: dict[str, Any], key: str) -> float | None:
    value = args.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not abs(value) <= MAX_WAKEUP_SECONDS):  # nan and inf too
        raise WakeupRefused(f"{key} must be a number of seconds, at most "
                            f"{MAX_WAKEUP_SECONDS:g}")
    return float(value)


def _when(args: dict[str, Any], now: datetime, limits: WakeupLimits, recurring_floor_s: float
          ) -> tuple[datetime | None, str | None, float | None]:
    """(due, cron, every_s) from the call's input, each checked against the limits."""
    given = [k for k in ("at", "after_s", "cron", "every_s") if args.get(k) is not None]
    if len(given) != 1:
        raise WakeupRefused("give exactly one of at, after_s, cron, every_s (got "
                            f"{', '.join(given) or 'none'})")
    shortest = limits.min_interval_s
    if "at" in given or "after_s" in given:
        if "at" in given:
            try:
                due = datetime.fromisoformat(str(args["at"]).replace("Z", "+00:00"))
            except ValueError:
                raise WakeupRefused(f"at {args['at']!r} is not an ISO 8601 time") from None
            due = due if due.tzinfo else due.replace(tzinfo=UTC)
        else:
            due = now + timedelta(seconds=_number(args, "after_s") or 0)
        if (due - now).total_seconds() < shortest:
            raise WakeupRefused(f"a wakeup must be at least {shortest:g} s from now")
        return due, None, None
    if "every_s" in given:
        every = _number(args, "every_s") or 0
        shortest = max(shortest, recurring_floor_s)
        if every < shortest:
            raise WakeupRefused(f"every_s {every:g} is shorter than the shortest interval "
                                f"this agent may use ({shortest:g} s)")
        return None, None, every
    cron = str(args["cron"])
    gap = cron_min_gap_s(parse_cron(cron), now)
    if gap is None:
        raise WakeupRefused(f"cron {cron!r} fires less than twice in five years; use at")
    if gap < shortest:
        raise WakeupRefused(f"cron {cron!r} fires every {gap:g} s at its closest, shorter "
                            f"than the shortest interval this agent may use ({shortest:g} s)")
    return None, " ".join(cron.split()), None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def interval_start(created: datetime) -> datetime:
    """Where an `every_s` wakeup's intervals count from: its creation, up to the whole
    second (Temporal's scheduler drops an offset's fraction of a second)."""
    whole = created.replace(microsecond=0)
    return whole if whole == created else whole + timedelta(seconds=1)


def interval_schedule_start(created: datetime) -> datetime:
    """The schedule's `start_at` for an `every_s` wakeup: a second past its interval start,
    so the start itself (k = 0, a fire at once) is skipped and the first is one interval
    on (every interval is `RECURRING_FLOOR_S` or more)."""
    return interval_start(created) + timedelta(seconds=1)


def interval_offset(created: datetime, every_s: float) -> timedelta:
    """The offset of a Temporal interval spec (fires at epoch + offset + k * every) that
    puts an `every_s` wakeup's fires at `interval_start(created) + k * every_s`: whole
    intervals after it was scheduled, not at the next multiple of the interval since 1970."""
    every = max(1, round(every_s * 1_000_000))
    return timedelta(microseconds=((interval_start(created) - _EPOCH) // _MICROSECOND)
                     % every)


def plan_wakeup(args: dict[str, Any], now: datetime, limits: WakeupLimits,
                active: list[Wakeup], wakeup_id: str,
                recurring_floor_s: float = RECURRING_FLOOR_S,
                refuse_unfired: bool = True) -> Wakeup:
    """The wakeup a `schedule_wakeup` call asks for, or WakeupRefused saying why not.
    `recurring_floor_s` is 0 only for sessions that scheduled before the floor existed;
    `refuse_unfired` False only for those that scheduled before a recurring wakeup whose
    first fire is past its expiry was refused (it was scheduled, and never fired)."""
    note = args.get("note")
    if not isinstance(note, str) or not note.strip():
        raise WakeupRefused("note must be a non-empty string: what your future self should do")
    if len(note) > MAX_WAKEUP_NOTE_CHARS:
        raise WakeupRefused(f"note has {len(note)} characters; the limit is "
                            f"{MAX_WAKEUP_NOTE_CHARS} (put more in a workspace file)")
    if len(active) >= limits.max_active:
        raise WakeupRefused(f"{len(active)} wakeups are scheduled already, the most this "
                            "agent may have at once; cancel one first")
    due, cron, every = _when(args, now, limits, recurring_floor_s)
    expiry = _number(args, "expires_in_s") or limits.expiry_s
    if expiry <= 0 or expiry > limits.expiry_s:
        raise WakeupRefused(f"expires_in_s must be between 0 and {limits.expiry_s:g} s")
    expires = now + timedelta(seconds=expiry)
    if due is not None and due > expires:
        raise WakeupRefused(f"at is past this agent's wakeup expiry ({expiry:g} s from now)")
    first = (interval_start(now) + timedelta(seconds=every) if every is not None else
             next_cron_fire(parse_cron(cron), now) if cron is not None else None)
    if refuse_unfired and first is not None and first > expires:
        raise WakeupRefused(f"its first fire ({first:%Y-%m-%d %H:%M} UTC) is past its expiry "
                            f"({expiry:g} s from now): it would never fire; use a shorter "
                            f"interval, a longer expires_in_s (at most {limits.expiry_s:g}), "
                            "or at")
    return Wakeup(id=wakeup_id, note=note.strip(), created=now, expires=expires, due=due,
                  cron=cron, every_s=every)


def wakeup_listing(wakeups: list[Wakeup]) -> str:
    """What `list_wakeups` answers: one line a wakeup."""
    if not wakeups:
        return "No wakeups are scheduled."
    lines = []
    for w in wakeups:
        when = (f"at {w.due.isoformat(timespec='seconds')}" if w.due else
                f"cron {w.cron!r}" if w.cron else f"every {w.every_s:g} s")
        lines.append(f"{w.id}: {when}, expires {w.expires.isoformat(timespec='seconds')}, "
                     f"fired {w.fired}x: {w.note}")
    return "\n".join(lines)


# ----- delegation ----------------------------------------------------------------------

def child_session_id(parent: str, agent: str, call_id: str) -> str:
    """The child's session (workflow) id: one per delegate call, so a retried call finds
    the child it started instead of starting another."""
    return f"{parent}.{agent}.{call_id[-24:]}"


def child_scope(agent: SubAgent, parent_scope: str | None) -> str | None:
    """The child's memory scope: the parent's, or the sub-agent's when it is narrower
    (`<parent>.<suffix>`); WakeupRefused-like ValueError otherwise."""
    scope = agent.memory_scope
    if scope is None or scope == parent_scope:
        return parent_scope
    if parent_scope is None or not scope.startswith(parent_scope + "."):
        raise ValueError(f"sub-agent {agent.name!r}: memory scope {scope!r} is not the "
                         f"parent's ({parent_scope!r}) or narrower ({parent_scope}.<name>)")
    return scope


def sub_agent_problems(sub_agents: list[SubAgent], builtin_names: list[str],
                       service_tools: list[str]) -> list[str]:
    """Every way the sub-agents are not a subset of their parent (the memory scope is
    checked when a child starts, against the session's: `child_scope`)."""
    problems: list[str] = []
    names = [a.name for a in sub_agents]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"sub-agent {name!r} is declared twice")
    for agent in sub_agents:
        where = f"sub-agent {agent.name!r}"
        if not _NAME.match(agent.name):
            problems.append(f"{where}: a name is 1-40 letters, digits, '_' or '-'")
        for tool in agent.builtin_tools or []:
            if tool not in builtin_names:
                problems.append(f"{where}: built-in tool {tool!r} is not the parent's")
        for tool in agent.tools or []:
            if tool not in service_tools:
                problems.append(f"{where}: tool {tool!r} is not among the parent's tools")
    return problems
