"""The mind: the agent's understanding of the work, revised edit by edit.

The document is markdown with fixed headings. Its rules: every heading of the template
stays, exactly and in order; Mission entries are never deleted (a status is marked on the
entry itself); each of the four sections stays within its token limit. Text inside fenced
code blocks is never read as structure, so a lesson that quotes a shell comment (`# ...`)
is not a heading.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from schemas.checkpoint.budgets import CheckpointBudgets, cut_to_tokens
from schemas.checkpoint.problems import Problem, ProblemKind
from schemas.tokens import count_tokens


@dataclass(frozen=True)
class TemplateHeading:
    level: int
    text: str
    guidance: str | None

    @property
    def line(self) -> str:
        return f"{'#' * self.level} {self.text}"


TEMPLATE_HEADINGS: tuple[TemplateHeading, ...] = (
    TemplateHeading(1, "Mind", None),
    TemplateHeading(
        2,
        "Where I stand",
        "_For whom and why I do this work; what I own and where that ends; my agreements "
        "with the user: how to report, when to ask, what I may decide, and what I am "
        "authorized to do._",
    ),
    TemplateHeading(
        2,
        "Goals",
        "_The mission, and the workstreams that serve it. When a step is done, go back to "
        "its workstream; when a workstream is done, go back to the mission or ask._",
    ),
    TemplateHeading(
        3,
        "Mission",
        "_The ultimate purpose of this conversation, in my own words, one entry per line. "
        "An entry is never deleted: when it is done, withdrawn by the user, or replaced, "
        "mark its status on the entry itself (for example `- [done] ...`). It changes only "
        "when the user changes it._",
    ),
    TemplateHeading(
        3,
        "Workstreams",
        "_Each workstream that serves the mission, with its status; where it has a queue, "
        "how far it got and what is next. A finished workstream folds into one line._",
    ),
    TemplateHeading(
        2,
        "Key decisions",
        "_Each decision with its reason. An overturned decision folds into the one that "
        "replaced it._",
    ),
    TemplateHeading(
        2,
        "Lessons",
        "_Principles that also apply later. Recurring lessons merge into one principle._",
    ),
)

# Keel's own lines in a cut mind: the marker where a section was cut, and the closing note.
CUT_MARKER_PREFIX = "[… cut here:"
CUT_NOTE_PREFIX = "[This mind was cut to fit its limits"

BUDGETED_SECTIONS: tuple[str, ...] = ("Where I stand", "Goals", "Key decisions", "Lessons")
MISSION = "Mission"

_TEMPLATE_LINES = frozenset(h.line for h in TEMPLATE_HEADINGS)
_GUIDANCE_LINES = frozenset(h.guidance for h in TEMPLATE_HEADINGS if h.guidance)
_ORDER = " → ".join(h.line for h in TEMPLATE_HEADINGS)

_HEADING_RE = re.compile(r"^(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE_RE = re.compile(r"^[ \t]{0,3}(```|~~~)")
_ENTRY_START_RE = re.compile(r"^(?:[-*+]|\d+[.)])[ \t]+")
_CONTINUATION_RE = re.compile(r"^[ \t]+(?![-*+][ \t]|\d+[.)][ \t])\S")

# Words that mark an entry's status rather than state its purpose.
_STATUS = (
    r"(?:status|done|complete[d]?|finished|achieved|withdrawn|replaced|superseded|active|"
    r"open|ongoing|in[ -]progress|blocked|paused|on[ -]hold|cancel(?:l)?ed|dropped|"
    r"abandoned|pending|obsolete)"
)
_LEADING_MARKERS = (
    re.compile(r"^\[[^\]\n]{0,40}\][ \t]*"),
    re.compile(rf"^\({_STATUS}\b[^)\n]{{0,60}}\)[ \t]*", re.IGNORECASE),
    re.compile(rf"^{_STATUS}\b[ \t]*(?::|—|–|--)[ \t]*", re.IGNORECASE),
)
_TRAILING_MARKERS = (
    re.compile(rf"[ \t]*[\[(]{_STATUS}\b[^\])\n]*[\])][.;,]?$", re.IGNORECASE),
    re.compile(rf"[ \t]+(?:—|–|--|-|:)[ \t]*{_STATUS}\b.*$", re.IGNORECASE),
)
_EMPHASIS_RE = re.compile(r"~~|\*\*|__")


@dataclass(frozen=True)
class _Heading:
    index: int  # line index
    level: int
    text: str

    @property
    def line(self) -> str:
        return f"{'#' * self.level} {self.text}"

    @property
    def template(self) -> TemplateHeading | None:
        for h in TEMPLATE_HEADINGS:
            if h.level == self.level and h.text == self.text:
                return h
        return None


def _headings(lines: list[str]) -> list[_Heading]:
    found: list[_Heading] = []
    in_fence = False
    for i, line in enumerate(lines):
        if _FENCE_RE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        m = _HEADING_RE.match(line)
        if m:
            found.append(_Heading(i, len(m.group(1)), m.group(2)))
    return found


def _is_template_line(line: str) -> bool:
    return line.rstrip() in _TEMPLATE_LINES or line.strip() in _GUIDANCE_LINES


def _content_tokens(lines: list[str]) -> int:
    """Tokens of what the model wrote: template headings and guidance lines are free."""
    return count_tokens("\n".join(x for x in lines if not _is_template_line(x)).strip())


def normalize_entry_text(text: str) -> str:
    """An entry's words without emphasis, extra spaces or closing punctuation.

    Striking an entry through (`~~...~~`) or putting it in bold marks it; it does not change
    its words, so comparison ignores both.
    """
    return " ".join(_EMPHASIS_RE.sub("", text).split()).rstrip(".;,:")


def mission_entry_core(entry: str) -> str:
    """The words of a Mission entry without its bullet and status markers.

    `- [done] Ship v2`, `- Ship v2 (status: done)` and `- Ship v2 — withdrawn by the user`
    all have the core `Ship v2`. An entry that is only a marker keeps its whole text.
    """
    text = normalize_entry_text(_ENTRY_START_RE.sub("", entry.strip(), count=1))
    core = text
    changed = True
    while changed and core:
        changed = False
        for pattern in (*_LEADING_MARKERS, *_TRAILING_MARKERS):
            stripped = pattern.sub("", core, count=1).strip()
            if stripped != core:
                core, changed = stripped, True
    core = normalize_entry_text(core)
    return core or text


# Only status marks, never any bracket: "- Ship [not] v2" must not pass for "- Ship v2".
_INNER_MARKERS = (
    re.compile(rf"\[(?:[ xX]|{_STATUS}\b[^\]\n]{{0,40}})\]", re.IGNORECASE),
    re.compile(rf"\({_STATUS}\b[^)\n]{{0,60}}\)", re.IGNORECASE),
)


def _without_inner_markers(text: str) -> str:
    # A status can land inside a wrapped entry ("- Fix CI [done]" above its second line).
    for pattern in _INNER_MARKERS:
        text = pattern.sub(" ", text)
    return normalize_entry_text(text)


def entry_survives(previous_entry: str, current_entries: list[str]) -> bool:
    """True when the previous entry's words still stand within some current entry."""
    core = mission_entry_core(previous_entry)
    return any(
        core in normalize_entry_text(e) or core in _without_inner_markers(e)
        for e in current_entries
    )


class MindDocument(BaseModel):
    text: str

    @classmethod
    def template(cls) -> MindDocument:
        parts: list[str] = []
        for h in TEMPLATE_HEADINGS:
            parts.append(h.line)
            if h.guidance:
                parts.append(h.guidance)
            parts.append("")
        return cls(text="\n".join(parts))

    # --- reading -------------------------------------------------------------------------

    def _lines(self) -> list[str]:
        return self.text.replace("\r\n", "\n").split("\n")

    def headings(self) -> list[str]:
        """Every heading line outside code fences, normalized (`## Goals`), in order."""
        return [h.line for h in _headings(self._lines())]

    def _template_hits(self) -> dict[str, _Heading]:
        # First occurrence of each template heading; duplicates are a validation problem.
        hits: dict[str, _Heading] = {}
        for h in _headings(self._lines()):
            if h.template is not None and h.text not in hits:
                hits[h.text] = h
        return hits

    def _section(self, lines: list[str], name: str,
                 ends_at: Callable[[_Heading, _Heading], bool]) -> tuple[int, int] | None:
        """The template heading `name`'s line and the end of its section: the first later
        heading `h` with `ends_at(h, heading)`, else the end of the text."""
        hit = self._template_hits().get(name)
        if hit is None:
            return None
        end = next((h.index for h in _headings(lines)
                    if h.index > hit.index and ends_at(h, hit)), len(lines))
        return hit.index, end

    def _body_lines(self, name: str) -> list[str] | None:
        """A heading's own lines: up to the next template heading, or the next heading at its
        own level or above."""
        lines = self._lines()
        bounds = self._section(lines, name,
                               lambda h, hit: h.template is not None or h.level <= hit.level)
        return None if bounds is None else lines[bounds[0] + 1 : bounds[1]]

    def _span(self, name: str) -> tuple[int, int] | None:
        """A budgeted section's line range: its heading up to the next heading at level 1-2."""
        return self._section(self._lines(), name, lambda h, _hit: h.level <= 2)

    def sections(self) -> dict[str, str]:
        """Each template heading's own text (guidance included), by heading text.

        `Goals` holds only what stands before `### Mission`; use `section_text` for a
        budgeted section with its subsections.
        """
        out: dict[str, str] = {}
        for h in TEMPLATE_HEADINGS:
            body = self._body_lines(h.text)
            if body is not None:
                out[h.text] = "\n".join(body).strip()
        return out

    def section_text(self, name: str) -> str | None:
        """A budgeted section's whole text below its heading, subsections included."""
        span = self._span(name)
        if span is None:
            return None
        return "\n".join(self._lines()[span[0] + 1 : span[1]]).strip()

    def mission_entries(self) -> list[str]:
        """The entries under `### Mission`: each list item, with its wrapped lines."""
        body = self._body_lines(MISSION) or []
        entries: list[str] = []
        current: list[str] | None = None
        in_fence = False
        for line in body:
            if _FENCE_RE.match(line):
                in_fence = not in_fence
                current = None
                continue
            if in_fence:
                continue
            if _ENTRY_START_RE.match(line):
                current = [line.rstrip()]
                entries.append("")
            elif current is not None and _CONTINUATION_RE.match(line):
                current.append(line.rstrip())
            else:
                current = None
                continue
            entries[-1] = "\n".join(current)
        return entries

    def section_tokens(self) -> dict[str, int]:
        """Tokens of each budgeted section, not counting template headings and guidance."""
        lines = self._lines()
        out: dict[str, int] = {}
        for name in BUDGETED_SECTIONS:
            span = self._span(name)
            out[name] = 0 if span is None else _content_tokens(lines[span[0] + 1 : span[1]])
        return out

    def total_tokens(self) -> int:
        """Tokens of everything the model wrote, inside sections or not."""
        return _content_tokens(self._lines())

    # --- checks --------------------------------------------------------------------------

    def structure_problems(self) -> list[Problem]:
        """Every template heading present once, exactly, in order; no other top headings."""
        by_text: dict[str, list[_Heading]] = {}
        unknown: list[_Heading] = []
        for h in _headings(self._lines()):
            if h.template is not None:
                by_text.setdefault(h.text, []).append(h)
            else:
                unknown.append(h)
        problems, paired = _template_heading_problems(by_text, unknown)
        problems += _unexpected_heading_problems(unknown, paired)
        return problems + _order_problems(by_text)

    def mission_problems(self, previous: MindDocument) -> list[Problem]:
        problems: list[Problem] = []
        before, now = previous.mission_entries(), self.mission_entries()
        if len(now) < len(before):
            problems.append(
                _mind(
                    ProblemKind.MISSION_FEWER_ENTRIES,
                    f"Mission has {len(now)} entries; before this checkpoint it had "
                    f"{len(before)}. Mission entries are never deleted: mark the status on "
                    "the entry itself (for example '- [done] ...').",
                    MISSION,
                )
            )
        for entry in before:
            if not entry_survives(entry, now):
                problems.append(
                    _mind(
                        ProblemKind.MISSION_ENTRY_MISSING,
                        f"the Mission entry '{entry.strip()}' was deleted or reworded; restore "
                        "its words and, if it is done, withdrawn or replaced, mark that status "
                        "on the entry itself.",
                        MISSION,
                    )
                )
        return problems

    def size_problems(self, budgets: CheckpointBudgets) -> list[Problem]:
        """Sections over their own limits (SECTION_OVER_LIMIT, however far over: the whole
        mind is kept in the record and the section shown cut), and the whole mind past
        twice its total limit (MIND_GREW_PAST_TWICE: the previous mind is kept)."""
        problems: list[Problem] = []
        limits = budgets.section_limits()
        for name, tokens in self.section_tokens().items():
            limit = limits[name]
            if tokens > limit:
                far = " (more than twice)" if tokens > 2 * limit else ""
                problems.append(
                    _mind(
                        ProblemKind.SECTION_OVER_LIMIT,
                        f"section '{name}' has {tokens} tokens; its limit is {limit}{far}. "
                        "Condense it: fold finished work into one line, merge recurring "
                        "lessons into a principle, fold overturned decisions into their "
                        "replacements.",
                        name,
                    )
                )
        total, total_limit = self.total_tokens(), budgets.mind_total_limit
        if total > 2 * total_limit:
            problems.append(
                _mind(
                    ProblemKind.MIND_GREW_PAST_TWICE,
                    f"the mind has {total} tokens, more than twice its limit of {total_limit}; "
                    "keep text inside the four sections and condense it.",
                    None,
                )
            )
        return problems

    def validate(  # type: ignore[override]  # pydantic's deprecated classmethod of that name
        self, previous: MindDocument, budgets: CheckpointBudgets
    ) -> list[Problem]:
        """Every problem of this mind, as a revision of `previous`."""
        return [
            *self.structure_problems(),
            *self.mission_problems(previous),
            *self.size_problems(budgets),
        ]


def _mind(kind: ProblemKind, message: str, section: str | None) -> Problem:
    return Problem(kind=kind, part="mind", message=message, section=section)


def _fold(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.casefold()).strip()


def _likely_rename(target: TemplateHeading, candidates: list[_Heading]) -> _Heading | None:
    """The unknown heading that most looks like `target` reworded, re-levelled or re-cased."""
    best: tuple[float, _Heading] | None = None
    for c in candidates:
        ratio = difflib.SequenceMatcher(None, _fold(target.text), _fold(c.text)).ratio()
        if ratio >= 0.75 and (best is None or ratio > best[0]):
            best = (ratio, c)
    return None if best is None else best[1]


def cut_sections(mind: MindDocument, budgets: CheckpointBudgets, full_copy_path: str) -> str:
    """The mind as the context shows it when sections are over their limits.

    Each over-limit section is cut to its limit where it crosses it, with a marker; the
    template headings and guidance always stay. Mission entries are never cut: the Goals
    budget is spent on them first and the rest of Goals is cut, so Goals can stay over its
    limit when Mission alone is. A last line points to the read-only copy of the whole mind.
    """
    lines = mind._lines()
    limits = budgets.section_limits()
    tokens = mind.section_tokens()
    over = [n for n in BUDGETED_SECTIONS if tokens[n] > limits[n] and mind._span(n) is not None]
    if not over:
        return mind.text
    mission_lines: set[int] = set()
    mission_hit = mind._template_hits().get(MISSION)
    mission_body = mind._body_lines(MISSION)
    if mission_hit is not None and mission_body is not None:
        mission_lines = set(range(mission_hit.index + 1, mission_hit.index + 1 + len(mission_body)))

    # Cut from the last section back, so earlier line numbers stay valid.
    for name in sorted(over, key=lambda n: mind._span(n) or (0, 0), reverse=True):
        start, end = mind._span(name) or (0, 0)
        limit = limits[name]
        protected = [i for i in range(start + 1, end) if i in mission_lines]
        room = limit
        if protected:
            room = max(0, limit - _content_tokens([lines[i] for i in protected]) - 1)
        lines[start + 1 : end] = _cut_block(
            lines[start + 1 : end], set(i - start - 1 for i in protected), room, limit
        )

    names = ", ".join(over)
    note = (
        f"{CUT_NOTE_PREFIX} ({names}). The whole mind is in the read-only file {full_copy_path}.]"
    )
    return "\n".join(lines).rstrip("\n") + "\n\n" + note + "\n"


def _cut_block(block: list[str], protected: set[int], room: int, limit: int) -> list[str]:
    """`block` with its free text cut to `room` tokens; template and protected lines stay."""
    free = [i for i, line in enumerate(block) if i not in protected and not _is_template_line(line)]
    joined = "\n".join(block[i] for i in free)
    kept = cut_to_tokens(joined, room)
    out: list[str] = []
    consumed = 0  # characters of `kept` placed so far
    marker_placed = False
    marker = f"{CUT_MARKER_PREFIX} this section is over its limit of {limit} tokens]"
    free_set = set(free)
    for i, line in enumerate(block):
        if i not in free_set:
            out.append(line)
            continue
        if consumed >= len(kept) and kept != joined:
            if not marker_placed:
                out.append(marker)
                marker_placed = True
            continue
        piece = kept[consumed : consumed + len(line)]
        consumed += len(line) + 1  # the newline that joined it
        out.append(piece)
        if len(piece) < len(line) and not marker_placed:
            out.append(marker)
            marker_placed = True
    if not marker_placed:
        # The cut fell exactly on the end of the free text (nothing visibly removed); still
        # say so, since the section was over its limit.
        out.append(marker)
    if block and not block[-1].strip() and out and out[-1].strip():
        out.append("")  # keep the blank line that sets the next heading apart
    return out


def _template_heading_problems(
    by_text: dict[str, list[_Heading]], unknown: list[_Heading]
) -> tuple[list[Problem], set[int]]:
    """Each template heading duplicated, renamed (paired with the unknown heading it most
    likely became) or missing; and the indexes of the unknown headings so paired."""
    problems: list[Problem] = []
    paired: set[int] = set()
    for t in TEMPLATE_HEADINGS:
        hits = by_text.get(t.text)
        if hits:
            if len(hits) > 1:
                where = ", ".join(str(h.index + 1) for h in hits)
                problems.append(
                    _mind(
                        ProblemKind.HEADING_DUPLICATED,
                        f"the heading '{t.line}' appears {len(hits)} times (lines {where}); "
                        "keep exactly one.",
                        t.text,
                    )
                )
            continue
        renamed = _likely_rename(t, [u for u in unknown if u.index not in paired])
        if renamed is not None:
            paired.add(renamed.index)
            problems.append(
                _mind(
                    ProblemKind.HEADING_RENAMED,
                    f"the heading '{t.line}' was changed to '{renamed.line}' "
                    f"(line {renamed.index + 1}); headings stay exactly as in the template.",
                    t.text,
                )
            )
        else:
            problems.append(
                _mind(
                    ProblemKind.HEADING_MISSING,
                    f"the heading '{t.line}' is missing; put it back exactly, in this "
                    f"order: {_ORDER}.",
                    t.text,
                )
            )
    return problems, paired


def _unexpected_heading_problems(unknown: list[_Heading], paired: set[int]) -> list[Problem]:
    """Top-level headings the template does not have (a rename's target excepted)."""
    return [
        _mind(
            ProblemKind.HEADING_UNEXPECTED,
            f"unexpected heading '{u.line}' (line {u.index + 1}): the mind has only the "
            "template's sections at this level; use a deeper heading (### or ####) "
            "inside a section, or plain text.",
            None,
        )
        for u in unknown
        if u.index not in paired and u.level <= 2
    ]


def _order_problems(by_text: dict[str, list[_Heading]]) -> list[Problem]:
    """Each template heading whose first occurrence comes after a later section's."""
    problems: list[Problem] = []
    firsts = sorted((hits[0] for hits in by_text.values()), key=lambda h: h.index)
    rank = {t.text: i for i, t in enumerate(TEMPLATE_HEADINGS)}
    latest: _Heading | None = None
    for h in firsts:
        if latest is not None and rank[h.text] < rank[latest.text]:
            problems.append(
                _mind(
                    ProblemKind.HEADING_OUT_OF_ORDER,
                    f"the heading '{h.line}' (line {h.index + 1}) comes after "
                    f"'{latest.line}' (line {latest.index + 1}); the order is: {_ORDER}.",
                    h.text,
                )
            )
        elif latest is None or rank[h.text] > rank[latest.text]:
            latest = h
    return problems
