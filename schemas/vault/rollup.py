"""Rollups: periods, the requests' markers and tools, plans, CORE.md, transcript entries.

A rollup request carries a marker in its system prompt (`<keel:rollup kind="daily">`), so the
offline model can recognise it and answer by rule, and a plan (what the model asked to
write) is stored before anything is applied, so a retried rollup never calls the model or
writes a card twice.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from datetime import date, datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from schemas.budget import Spend
from schemas.vault.card import CardFact
from schemas.vault.schema import CORE_MAX_CHARS, CORE_MAX_GOALS, CardOp, Confidence, VaultSchema
from schemas.vault.scope import DEFAULT_SCOPE


class RollupKind(StrEnum):
    DAILY = "daily"
    WEEKLY = "weekly"
    MONTHLY = "monthly"
    YEARLY = "yearly"
    FLUSH = "flush"  # the memory-flush before a checkpoint: facts only, no summary


MARKER_RE = re.compile(r'<keel:rollup kind="(\w+)"(?: period="([^"]*)")?>')
# How many earlier periods a run looks back over for ones a stopped worker missed.
CATCHUP_PERIODS = {RollupKind.DAILY: 14, RollupKind.WEEKLY: 5, RollupKind.MONTHLY: 3,
                   RollupKind.YEARLY: 1}
NOTIFYING_KINDS = (RollupKind.DAILY, RollupKind.WEEKLY)


def rollup_notifies(kind: RollupKind, explicit: bool | None) -> bool:
    """Daily and weekly rollups report; monthly and yearly run silent unless asked."""
    return explicit if explicit is not None else kind in NOTIFYING_KINDS


def marker(kind: RollupKind, period: str = "") -> str:
    return f'<keel:rollup kind="{kind.value}" period="{period}">'


def request_kind(request: dict[str, Any]) -> tuple[RollupKind, str] | None:
    """The rollup kind and period a Messages API request is for; None for any other. The
    marker is in the system prompt, or (a memory flush that shares the session's prefix)
    opens the last block of the last message."""
    system = request.get("system")
    if isinstance(system, list):
        system = "\n".join(b.get("text", "") for b in system if isinstance(b, dict))
    if not isinstance(system, str):
        return None
    m = MARKER_RE.search(system)
    messages = request.get("messages") or []
    last = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
    if not m and isinstance(last, list) and last and isinstance(last[-1], dict):
        m = MARKER_RE.match(str(last[-1].get("text", "")))
    if not m:
        return None
    try:
        return RollupKind(m.group(1)), m.group(2) or ""
    except ValueError:
        return None


# --- periods ----------------------------------------------------------------------------


class Period(BaseModel):
    kind: RollupKind
    key: str  # file stem: 2026-06-01 / 2026-05-31 (week start) / 2026-05 / 2026
    start: date
    end: date  # inclusive

    def days(self) -> list[date]:
        return [self.start + timedelta(days=i) for i in range((self.end - self.start).days + 1)]


def _month_start(d: date) -> date:
    return d.replace(day=1)


def _prev_month(d: date) -> date:
    return (_month_start(d) - timedelta(days=1)).replace(day=1)


def period_for(kind: RollupKind, start: date) -> Period:
    if kind == RollupKind.DAILY:
        return Period(kind=kind, key=start.isoformat(), start=start, end=start)
    if kind == RollupKind.WEEKLY:
        return Period(kind=kind, key=start.isoformat(), start=start,
                      end=start + timedelta(days=6))
    if kind == RollupKind.MONTHLY:
        nxt = (start.replace(day=28) + timedelta(days=4)).replace(day=1)
        return Period(kind=kind, key=start.strftime("%Y-%m"), start=start,
                      end=nxt - timedelta(days=1))
    if kind == RollupKind.YEARLY:
        return Period(kind=kind, key=str(start.year), start=start,
                      end=start.replace(month=12, day=31))
    raise ValueError(f"no period for {kind}")


def due_periods(kind: RollupKind, local_today: date) -> list[Period]:
    """The period a run on `local_today` closes, then earlier ones (newest first) that a
    stopped worker may have missed.

    daily: yesterday. weekly: the seven days ending yesterday. monthly: the previous month.
    yearly: the previous year.
    """
    out: list[Period] = []
    for back in range(CATCHUP_PERIODS[kind]):
        if kind == RollupKind.DAILY:
            start = local_today - timedelta(days=1 + back)
        elif kind == RollupKind.WEEKLY:
            start = local_today - timedelta(days=7 * (back + 1))
        elif kind == RollupKind.MONTHLY:
            start = _prev_month(local_today)
            for _ in range(back):
                start = _prev_month(start)
        else:
            start = date(local_today.year - 1 - back, 1, 1)
        out.append(period_for(kind, start))
    return out


def week_month(week_start: date) -> str:
    """The month a week belongs to: that of its middle day, so each week counts once."""
    return (week_start + timedelta(days=3)).strftime("%Y-%m")


# --- plans ------------------------------------------------------------------------------


class CoreUpdate(BaseModel):
    facts: list[str] | None = None
    preferences: list[str] | None = None
    goals: list[str] | None = None
    lessons: list[str] = Field(default_factory=list)  # new lessons; dated on apply


class RollupPlan(BaseModel):
    """What one rollup decided, stored before it is applied."""

    kind: RollupKind
    period: str
    facts: list[CardFact] = Field(default_factory=list)
    summary: str = ""
    core: CoreUpdate | None = None
    rejected: list[str] = Field(default_factory=list)  # tool calls that could not be read
    notes: list[str] = Field(default_factory=list)  # problems with the material itself
    input_tokens: int = 0  # the source material's size (for the cost report)
    model_calls: int = 0
    # What its requests cost, and who asked them (a flush: the checkpoint attempt; a
    # rollup: its activity), charged once: a later attempt reusing the plan asked nothing.
    spent: Spend = Field(default_factory=Spend)
    made_by: str | None = None


class RollupInput(BaseModel):
    """A scheduled rollup: `as_of` is when it was meant to run (None: the schedule's time,
    else now). Catch-up of missed periods is decided from it."""

    kind: RollupKind
    as_of: datetime | None = None
    notify: bool | None = None  # None: daily and weekly notify, monthly and yearly are silent
    scope: str = DEFAULT_SCOPE  # whose vault (the nightly fan-out gives one scope per run)


class ApplyResult(BaseModel):
    added: int = 0
    superseded: int = 0
    noop: int = 0
    rejected: int = 0
    skipped_done: int = 0  # ops a previous attempt had already applied
    summary_path: str = ""
    summary_tokens: int = 0
    core_chars: int | None = None
    core_dropped: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class RollupReport(BaseModel):
    kind: RollupKind
    scope: str = DEFAULT_SCOPE
    periods: list[str] = Field(default_factory=list)
    results: dict[str, ApplyResult] = Field(default_factory=dict)
    failures: dict[str, str] = Field(default_factory=dict)
    skipped: list[str] = Field(default_factory=list)
    commit_problem: str | None = None
    notified: bool = False
    committed: bool = False
    spent: Spend = Field(default_factory=Spend)  # its model requests, as the API counted them

    def text(self) -> str:
        if not self.periods and not self.failures:
            return f"{self.kind.value} rollup: nothing to roll up."
        lines = [f"{self.kind.value} rollup: {', '.join(self.periods) or 'no period done'}"]
        for period, r in self.results.items():
            bits = [f"{r.added} added", f"{r.superseded} superseded", f"{r.noop} unchanged"]
            if r.rejected:
                bits.append(f"{r.rejected} rejected")
            line = f"- {period}: {', '.join(bits)}"
            if r.summary_path:
                line += f"; summary {r.summary_path} ({r.summary_tokens} tokens)"
            if r.core_chars is not None:
                line += f"; CORE.md {r.core_chars} chars"
            lines.append(line)
            lines.extend(f"  - {n}" for n in r.notes[:5])
        lines.extend(f"- {p}: FAILED: {why}" for p, why in self.failures.items())
        if self.spent.usd or self.spent.input_tokens:
            lines.append(f"- model: {self.spent.said()}")
        if self.commit_problem:
            lines.append(f"- vault not committed: {self.commit_problem}")
        return "\n".join(lines)


# --- tools ------------------------------------------------------------------------------


def write_card_tool(schema: VaultSchema) -> dict[str, Any]:
    """The write_card tool; its type, status and domain enums come from schema.json."""
    props: dict[str, Any] = {
        "op": {"type": "string", "enum": [o.value for o in CardOp],
               "description": "ADD: a new card or a new line. SUPERSEDE: the fact replaces "
                              "an older value (kept in History). NOOP: already known."},
        "type": {"type": "string", "enum": list(schema.types)},
        "title": {"type": "string", "description": "The card's name, e.g. a person's full "
                                                   "name or a project's name."},
        "field": {"type": "string", "description": "For a single-valued attribute "
                  "(employer, city, deadline, choice, why): a short name. A new value for "
                  "the same field supersedes the old one. Omit for free-form facts."},
        "value": {"type": "string", "description": "The fact, in one line."},
        "confidence": {"type": "string", "enum": [c.value for c in Confidence],
                       "description": "EXTRACTED: the user said it. INFERRED: deduced."},
        "status": {"type": "string", "enum": schema.all_statuses()},
        "description": {"type": "string", "description": "One line saying what the card "
                                                         "is about (new cards)."},
        "links": {"type": "array", "items": {"type": "string"},
                  "description": "Titles of related cards, linked as [[wikilinks]]."},
        "tags": {"type": "array", "items": {"type": "string"}},
        "replaces": {"type": "string", "description": "SUPERSEDE without a field: the old "
                                                      "line's value."},
    }
    if schema.domains:
        props["domain"] = {"type": "string", "enum": list(schema.domains)}
    return {
        "name": "write_card",
        "description": "Record one durable fact on a typed card of the vault. One call per "
                       "fact. Types and statuses are fixed by the vault's schema.",
        "input_schema": {"type": "object", "properties": props,
                         "required": ["op", "type", "title", "value", "confidence"]},
    }


WRITE_SUMMARY_TOOL: dict[str, Any] = {
    "name": "write_summary",
    "description": "The day's summary in markdown bullets: what happened, what was decided, "
                   "what is open. Link cards as [[Title]].",
    "input_schema": {"type": "object", "properties": {"summary": {"type": "string"}},
                     "required": ["summary"]},
}

UPDATE_CORE_TOOL: dict[str, Any] = {
    "name": "update_core",
    "description": f"Rewrite CORE.md (at most {CORE_MAX_CHARS} characters, read in every "
                   "prompt): durable facts, standing preferences, at most "
                   f"{CORE_MAX_GOALS} active goals; lessons are NEW behavioural lessons from "
                   "exchanges the user corrected today (they are dated and kept).",
    "input_schema": {"type": "object", "properties": {
        "facts": {"type": "array", "items": {"type": "string"}},
        "preferences": {"type": "array", "items": {"type": "string"}},
        "goals": {"type": "array", "items": {"type": "string"}, "maxItems": CORE_MAX_GOALS},
        "lessons": {"type": "array", "items": {"type": "string"}},
    }},
}


def read_plan_reply(kind: RollupKind, period: str, content: list[dict[str, Any]],
                    schema: VaultSchema) -> RollupPlan:
    """Turn a model reply (content blocks) into a plan; unreadable calls are listed."""
    plan = RollupPlan(kind=kind, period=period)
    texts: list[str] = []
    for block in content:
        if block.get("type") == "text":
            texts.append(block.get("text", ""))
            continue
        if block.get("type") != "tool_use":
            continue
        name, args = block.get("name"), block.get("input") or {}
        try:
            if name == "write_card":
                fact = CardFact.model_validate(args)
                if schema.resolve_type(fact.type) is None:
                    plan.rejected.append(f"write_card: unknown type {fact.type!r}")
                    continue
                plan.facts.append(fact)
            elif name == "write_summary":
                plan.summary = str(args.get("summary", "")).strip()
            elif name == "update_core":
                plan.core = CoreUpdate.model_validate(args)
            else:
                plan.rejected.append(f"unknown tool {name!r}")
        except ValueError as err:
            plan.rejected.append(f"{name}: {str(err).splitlines()[0]}")
    if not plan.summary and kind not in (RollupKind.FLUSH,):
        plan.summary = "\n".join(t for t in texts if t.strip()).strip()
    return plan


# --- CORE.md ----------------------------------------------------------------------------

CORE_SECTIONS = ("Facts", "Preferences", "Goals", "Lessons")


class CoreDoc(BaseModel):
    facts: list[str] = Field(default_factory=list)
    preferences: list[str] = Field(default_factory=list)
    goals: list[str] = Field(default_factory=list)
    lessons: list[str] = Field(default_factory=list)  # "YYYY-MM-DD: text"
    other: list[tuple[str, list[str]]] = Field(default_factory=list)  # a person's sections


def parse_core(text: str) -> CoreDoc:
    doc = CoreDoc()
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            name = line[3:].strip()
            base = name.split("(")[0].strip().casefold()
            match = next((s for s in CORE_SECTIONS if s.casefold() == base), None)
            if match:
                current = getattr(doc, match.lower())
            else:
                current = []
                doc.other.append((name, current))
        elif current is not None and line.strip():
            item = line.strip()
            if item.startswith("- ") and current is not None and any(
                    current is getattr(doc, s.lower()) for s in CORE_SECTIONS):
                item = item[2:].strip()
            current.append(item)
    return doc


def render_core(doc: CoreDoc) -> str:
    out = ["# Core", ""]
    for name in CORE_SECTIONS:
        items = getattr(doc, name.lower())
        if not items:
            continue
        heading = f"## {name}" + (f" (at most {CORE_MAX_GOALS})" if name == "Goals" else "")
        out.append(heading)
        out.extend(f"- {item}" for item in items)
        out.append("")
    for name, lines in doc.other:
        out.append(f"## {name}")
        out.extend(lines)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def merge_core(current: CoreDoc, update: CoreUpdate, today: str,
               cap: int = CORE_MAX_CHARS) -> tuple[CoreDoc, list[str]]:
    """CORE.md after a daily rollup, within its cap: (doc, what was dropped to fit).

    At most 3 goals; lessons are dated and kept; to fit the cap the oldest lessons go first,
    then the last preferences and facts. A person's own sections are never dropped.
    """
    doc = current.model_copy(deep=True)
    dropped: list[str] = []
    if update.facts is not None:
        doc.facts = [f.strip() for f in update.facts if f.strip()]
    if update.preferences is not None:
        doc.preferences = [p.strip() for p in update.preferences if p.strip()]
    if update.goals is not None:
        doc.goals = [g.strip() for g in update.goals if g.strip()]
    if len(doc.goals) > CORE_MAX_GOALS:
        dropped.extend(f"goal: {g}" for g in doc.goals[CORE_MAX_GOALS:])
        doc.goals = doc.goals[:CORE_MAX_GOALS]
    known = {ln.split(": ", 1)[-1].casefold() for ln in doc.lessons}
    for lesson in update.lessons:
        lesson = " ".join(lesson.split())
        if lesson and lesson.casefold() not in known:
            doc.lessons.append(f"{today}: {lesson}")
            known.add(lesson.casefold())
    for attr in ("lessons", "preferences", "facts"):
        while len(render_core(doc)) > cap and getattr(doc, attr):
            items = getattr(doc, attr)
            gone = items.pop(0) if attr == "lessons" else items.pop()
            dropped.append(f"{attr[:-1]}: {gone}")
    return doc, dropped


# --- daily transcript entries -----------------------------------------------------------

# A session id may hold spaces and colons (never "-->" or a line break: session_id_problem):
# the id is all up to the last ":<seq> -->" of the line.
ENTRY_MARK_RE = re.compile(r"<!-- keel:([^\n]+?):(\d+) -->")


def entry_marker(session_id: str, seq: int) -> str:
    return f"<!-- keel:{session_id}:{seq} -->"


# An entry heading's marker as a snippet may hold it: whole, or cut off by the snippet's end.
_SHOWN_MARK_RE = re.compile(r"(?m)^(####[^\n]*?) ?<!-- keel:(?:[^\n]+?:\d+ -->$|[^\n>]*\Z)")


def without_markers(text: str) -> str:
    """Text as a person or the model reads it: the entry headings' markers (there for the
    vault's writer to find an entry again) left out; the heading's time, speaker and
    session stay, and a message's own words are shown as written (`unescape_markers`)."""
    return unescape_markers(_SHOWN_MARK_RE.sub(r"\1", text))


# An entry marker's opening inside a message's words, and its escaped forms: `<` becomes
# `&lt;`, and an `&lt;` already there gains an `amp;` (and so on), so escaping is undone
# exactly. Markdown shows `&lt;` as `<`: a person reading the daily file sees the words.
_MARK_OPEN = re.compile(r"(<|&(?:amp;)*lt;)(?=!-- keel:)")


def escape_markers(body: str) -> str:
    """A message's words with every entry marker in them made inert: a message holding
    `#### … <!-- keel:s1:9 -->` would otherwise be read as an entry of its own (another
    speaker's, another session's) by every reader of the daily file."""
    return _MARK_OPEN.sub(lambda m: "&lt;" if m.group(1) == "<" else "&amp;" + m.group(1)[1:],
                          body)


def unescape_markers(body: str) -> str:
    """`escape_markers` undone: the message's own words."""
    def one(m: re.Match[str]) -> str:
        opening = m.group(1)  # "<" itself: a hand edit, or an entry written before escaping
        return opening if opening == "<" else "<" if opening == "&lt;" else "&" + opening[5:]
    return _MARK_OPEN.sub(one, body)


def transcript_entry(session_id: str, seq: int, when: datetime, speaker: str, text: str) -> str:
    """One message as it goes in daily/YYYY-MM-DD.md, word for word (its markers made
    inert), found again by marker."""
    body = escape_markers(text.rstrip("\n"))
    return (f"\n#### {when.strftime('%H:%M:%S')} · {speaker} · {session_id} "
            f"{entry_marker(session_id, seq)}\n\n{body}\n")


def split_transcript(text: str) -> list[tuple[str, int, str]]:
    """(session_id, seq, entry text) for each marked entry of a daily file."""
    out: list[tuple[str, int, str]] = []
    marks = [m for m in ENTRY_MARK_RE.finditer(text) if _at_heading(text, m.start())]
    for i, m in enumerate(marks):
        start = text.rfind("\n", 0, m.start()) + 1
        end = (text.rfind("\n", 0, marks[i + 1].start()) + 1) if i + 1 < len(marks) else len(
            text)
        out.append((m.group(1), int(m.group(2)), text[start:end].strip()))
    return out


def drop_session_entries(text: str, session_id: str,
                         seqs: Collection[int] | None = None) -> tuple[str, int]:
    """A daily file's text without `session_id`'s marked entries (each from its heading up
    to the next entry's heading, or the end; only those of `seqs` when given), and how many
    went; the rest byte for byte, so a file of other sessions' entries reads as if the
    session had never written there."""
    marks = [m for m in ENTRY_MARK_RE.finditer(text) if _at_heading(text, m.start())]
    kept: list[str] = []
    at = dropped = 0
    for i, m in enumerate(marks):
        if m.group(1) != session_id or (seqs is not None and int(m.group(2)) not in seqs):
            continue
        start = text.rfind("\n", 0, m.start()) + 1
        end = (text.rfind("\n", 0, marks[i + 1].start()) + 1) if i + 1 < len(marks) else len(
            text)
        kept.append(text[at:start])
        at, dropped = end, dropped + 1
    if not dropped:
        return text, 0
    out = "".join(kept) + text[at:]
    if at == len(text) and out.endswith("\n\n"):  # the last went: not its blank line
        out = out[:-1]
    return out, dropped


def _at_heading(text: str, pos: int) -> bool:
    line_start = text.rfind("\n", 0, pos) + 1
    return text.startswith("#### ", line_start)


_HEADING_RE = re.compile(r"^#### (\d{2}:\d{2}:\d{2}) · (\w+) · ")


def parse_entry(entry: str) -> tuple[str, str, str]:
    """(role, time, body) of one transcript entry as `split_transcript` returns it."""
    first, _, rest = entry.partition("\n")
    m = _HEADING_RE.match(first)
    if not m:
        return "user", "", unescape_markers(entry.strip())
    return m.group(2), m.group(1), unescape_markers(rest.strip())


# --- what a rollup request carries ------------------------------------------------------


def _fence_safe(text: str, tag: str) -> str:
    # Material must not close the element it sits in.
    return text.replace(f"</{tag}>", f"</ {tag}>")


def render_entries(entries: list[tuple[str, str, str]]) -> list[str]:
    """(role, time, body) -> one <entry> element each."""
    return [f'<entry role="{role}" time="{time}">\n{_fence_safe(body, "entry")}\n</entry>'
            for role, time, body in entries]


ENTRY_RE = re.compile(r'<entry role="(\w+)" time="([^"]*)">\n(.*?)\n</entry>', re.S)
SOURCE_RE = re.compile(r'<summary period="([^"]*)">\n(.*?)\n</summary>', re.S)
CORE_BLOCK_RE = re.compile(r"<core>\n(.*?)\n</core>", re.S)


def chunk_texts(items: list[str], budget: int, count: Any) -> list[list[str]]:
    """Greedy packing of items into chunks of at most `budget` tokens (as `count` counts);
    an item bigger than the budget is cut at the budget rather than dropped."""
    from schemas.tokens import truncate_to_tokens

    chunks: list[list[str]] = []
    current: list[str] = []
    used = 0
    for item in items:
        n = count(item)
        if n > budget:
            item, n = truncate_to_tokens(item, budget) + "\n[… cut: over the chunk budget]", budget
        if current and used + n > budget:
            chunks.append(current)
            current, used = [], 0
        current.append(item)
        used += n
    if current:
        chunks.append(current)
    return chunks


def render_summary(period: Period, summary: str, sources: list[str]) -> str:
    """A summary file: frontmatter, the summary, and links to what it was made from."""
    title = {RollupKind.DAILY: "Day", RollupKind.WEEKLY: "Week",
             RollupKind.MONTHLY: "Month", RollupKind.YEARLY: "Year"}.get(period.kind, "")
    links = ", ".join(f"[[{s}]]" for s in sources)
    return (f"---\ntype: summary\nkind: {period.kind.value}\nperiod: \"{period.key}\"\n"
            f"start: {period.start.isoformat()}\nend: {period.end.isoformat()}\n---\n"
            f"# {title} {period.key}\n\n{summary.strip()}\n\n"
            + (f"Sources: {links}\n" if sources else ""))
