"""The memo: the user's own words, kept by ticking a checklist.

The model only ticks. Keel copies each ticked message's original text from the record, so
the user's words cannot drift: a memo entry is always a prefix of the message it came from,
cut only to fit a budget, and then it says which message in the record holds all of it.

Invariant: every user message is in the context (the live window, or carried as the
request of the turn in progress) or in the memo, until the model releases it. Candidates
come ticked, so a checkpoint writer that does nothing with the checklist drops nothing; a
turn's own messages are carried, not listed (`IN_TURN_RULE`), and listed once their turn
is over.
"""

from __future__ import annotations

import difflib
import re
import textwrap

from pydantic import BaseModel, Field

from schemas.checkpoint.budgets import CheckpointBudgets, cut_to_tokens
from schemas.checkpoint.problems import Problem, ProblemKind
from schemas.messages import MessageType, RecordRow
from schemas.tokens import count_tokens

PREVIEW_CHARS = 80

# The one rule for the user's messages of the turn in progress, said the same way by the
# checklist (its header) and by the checkpoint instruction (schemas.checkpoint.request).
IN_TURN_RULE = (
    "Messages of the turn in progress are not listed; they stay in the context word for "
    "word, as the current request, and are listed (ticked) once their turn is over."
)

CHECKLIST_HEADER = (
    "# Memo checklist: the user's own messages that leave the context now",
    "# Change only the boxes: [x] -> [ ] releases a message, [ ] -> [x] keeps it. Keel copies",
    "# each kept message's original text from the record; do not retype it anywhere.",
    "# Every message comes ticked: nothing the user said is dropped unless you release it.",
    "# Keep a message that sets or changes the direction, states a constraint or a",
    "#   prohibition, expresses a preference, or grants a permission.",
    "# Release a message once it is withdrawn, superseded, or done, or once the mind",
    "#   holds its meaning completely.",
    '# Release instructions that only move the work along, such as "continue", and short',
    "#   replies that make no sense on their own.",
    "# A released message is not offered again; it stays in the record under its number.",
    *textwrap.wrap(IN_TURN_RULE, 88, initial_indent="# ", subsequent_indent="#   "),
)

# A candidate line: `- [ ] #12 preview`. The box is the fourth character.
_LINE_RE = re.compile(r"^- \[([ xX])\] #(\d+)(?: (.*))?$")
_BOX_AT = 3


class MemoCandidate(BaseModel):
    seq: int
    text: str  # the message's original text, from the record
    tokens: int = 0  # as recorded; budgets recount the text so a stale count cannot overrun
    kept_before: bool = False


def preview(text: str) -> str:
    """The message on one line, cut to about 80 characters."""
    flat = " ".join(text.split())
    if not flat:
        return "(empty message)"
    if len(flat) <= PREVIEW_CHARS:
        return flat
    return flat[: PREVIEW_CHARS - 1].rstrip() + "…"


def render_checklist(candidates: list[MemoCandidate]) -> str:
    lines = list(CHECKLIST_HEADER)
    lines.append("")
    for c in sorted(candidates, key=lambda c: c.seq):
        # Every candidate comes ticked: only the model's release drops a user's message.
        lines.append(f"- [x] #{c.seq} {preview(c.text)}")
    return "\n".join(lines) + "\n"


class ChecklistResult(BaseModel):
    ticked: list[int] = Field(default_factory=list)
    problems: list[Problem] = Field(default_factory=list)
    untouched: bool = False

    @property
    def changed_beyond_boxes(self) -> bool:
        return bool(self.problems)


def _lines(text: str) -> list[str]:
    # Line endings and newlines at the very end carry nothing the model wrote; an editor
    # may add or drop them, so they do not count as changes.
    return text.replace("\r\n", "\n").rstrip("\n").split("\n")


def _shape(line: str) -> str:
    """The line with its box blanked when it is a candidate line with an allowed box."""
    if _LINE_RE.match(line):
        return line[:_BOX_AT] + "\0" + line[_BOX_AT + 1 :]
    return line


def _quote(line: str) -> str:
    return repr(line if len(line) <= 70 else line[:69] + "…")


def _changed(message: str, line: int, source: str | None = None) -> Problem:
    m = _LINE_RE.match(source or "")
    return Problem(
        kind=ProblemKind.CHECKLIST_CHANGED,
        part="memo",
        message=message,
        line=line,
        seq=int(m.group(2)) if m else None,
    )


def parse_checklist(original: str, edited: str) -> ChecklistResult:
    """The ticked message numbers, and every change that is not a checkbox flip."""
    before, after = _lines(original), _lines(edited)
    if before == after:
        return ChecklistResult(ticked=_ticks(after), untouched=True)

    problems: list[Problem] = []
    ticked: list[int] = []
    matcher = difflib.SequenceMatcher(
        None, [_shape(x) for x in before], [_shape(x) for x in after], autojunk=False
    )
    deleted: list[tuple[int, str]] = []
    inserted: list[tuple[int, str]] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            ticked += _ticks(after[j1:j2])
            continue
        if op == "replace":
            for k in range(min(i2 - i1, j2 - j1)):
                problems.append(_replaced(before[i1 + k], after[j1 + k], i1 + k + 1))
            deleted += [(i + 1, before[i]) for i in range(i1 + (j2 - j1), i2)]
            inserted += [(j + 1, after[j]) for j in range(j1 + (i2 - i1), j2)]
        elif op == "delete":
            deleted += [(i + 1, before[i]) for i in range(i1, i2)]
        elif op == "insert":
            inserted += [(j + 1, after[j]) for j in range(j1, j2)]

    # A line that left one place and arrived at another was moved, not removed and added.
    arrived = list(inserted)
    for n, line in deleted:
        match = next((a for a in arrived if _shape(a[1]) == _shape(line)), None)
        if match is not None:
            arrived.remove(match)
            problems.append(
                _changed(
                    f"line {n} {_quote(line)} was moved to line {match[0]}; keep the order.",
                    n,
                    line,
                )
            )
        else:
            problems.append(_changed(f"line {n} {_quote(line)} was removed; put it back.", n, line))
    for n, line in arrived:
        problems.append(
            _changed(f"line {n} {_quote(line)} was added; remove it (only tick boxes).", n)
        )
    problems.sort(key=lambda p: p.line or 0)
    return ChecklistResult(ticked=sorted(set(ticked)), problems=problems)


def _replaced(old: str, new: str, n: int) -> Problem:
    if _LINE_RE.match(old) and len(old) == len(new) and old[:_BOX_AT] == new[:_BOX_AT]:
        if old[_BOX_AT + 1 :] == new[_BOX_AT + 1 :]:
            return _changed(
                f"line {n}: the box holds {new[_BOX_AT]!r}; a box holds only ' ' (released) "
                "or 'x' (kept).",
                n,
                old,
            )
    col = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), None)
    col = min(len(old), len(new)) if col is None else col
    return _changed(
        f"line {n} was changed beyond its checkbox (first difference at character {col + 1}): "
        f"it was {_quote(old)}, now {_quote(new)}; restore it and change only the box.",
        n,
        old,
    )


def _ticks(lines: list[str]) -> list[int]:
    out: list[int] = []
    for line in lines:
        m = _LINE_RE.match(line)
        if m and m.group(1) in "xX":
            out.append(int(m.group(2)))
    return out


# --- assembly ----------------------------------------------------------------------------


def cut_note(seq: int) -> str:
    return f"[cut: the full text is message #{seq} of the record]"


class MemoEntry(BaseModel):
    seq: int
    text: str  # always a prefix of the original message, byte for byte
    cut: bool = False

    @property
    def note(self) -> str | None:
        return cut_note(self.seq) if self.cut else None


class MemoAssembly(BaseModel):
    entries: list[MemoEntry] = Field(default_factory=list)
    dropped_seqs: list[int] = Field(default_factory=list)  # kept, but stay only in the record
    total_tokens: int = 0  # tokens of the entries' text; cut notes are Keel's, not counted
    fallbacks: list[str] = Field(default_factory=list)

    def render(self) -> str:
        """The entries as the checkpoint shows them, each under its message number."""
        blocks: list[str] = []
        for e in self.entries:
            body = e.text if e.note is None else f"{e.text}\n{e.note}"
            blocks.append(f"#{e.seq}:\n{body}")
        if self.dropped_seqs:
            refs = ", ".join(f"#{s}" for s in self.dropped_seqs)
            blocks.append(f"Also kept, too long to show here; read them in the record: {refs}")
        return "\n\n".join(blocks)


def _fair_share(sizes: list[int], total: int) -> int:
    """The largest cap c with sum(min(s, c)) <= total: what even shortening gives each."""
    remaining, left = total, len(sizes)
    for size in sorted(sizes):
        if size * left <= remaining:
            remaining -= size
            left -= 1
        else:
            return remaining // left
    return max(sizes, default=0)


def _kept_sizes(kept: list[MemoCandidate], per_message: int) -> dict[int, int]:
    return {c.seq: min(count_tokens(c.text), per_message) for c in kept}


def assemble_memo(kept: list[MemoCandidate], budgets: CheckpointBudgets) -> MemoAssembly:
    """The memo from the kept messages, within its budgets, keeping more rather than less.

    Each message is cut to the per-message limit. Over the total, every entry gets an even
    share (short ones keep their size, the rest share what is left). When the share would
    fall under the floor, messages are left in the record from the second-oldest on, until
    the first and the newest ones each get at least the floor.
    """
    by_seq: dict[int, MemoCandidate] = {}
    for c in kept:
        by_seq.setdefault(c.seq, c)
    ordered = [by_seq[s] for s in sorted(by_seq)]
    sizes = _kept_sizes(ordered, budgets.memo_per_message)
    fallbacks: list[str] = []

    chosen = ordered
    cap = budgets.memo_per_message
    if sum(sizes.values()) > budgets.memo_total:
        cap = _fair_share(list(sizes.values()), budgets.memo_total)
        while (cap < budgets.memo_share_floor and len(chosen) > 1
               and sum(sizes[c.seq] for c in chosen) > budgets.memo_total):
            chosen = [chosen[0], *chosen[2:]]
            cap = _fair_share([sizes[c.seq] for c in chosen], budgets.memo_total)
        cap = min(cap, budgets.memo_per_message)
        shortened = sum(1 for c in chosen if sizes[c.seq] > cap)
        fallbacks.append(
            f"memo over budget ({sum(sizes.values())} > {budgets.memo_total} tokens): "
            f"{shortened} message(s) shortened evenly to at most {cap} tokens each"
        )
    chosen_seqs = {c.seq for c in chosen}
    dropped = [c.seq for c in ordered if c.seq not in chosen_seqs]
    if dropped:
        fallbacks.append(
            "memo still over budget when shortened: kept the first and newest messages; "
            "left in the record: " + ", ".join(f"#{s}" for s in dropped)
        )

    entries: list[MemoEntry] = []
    total = 0
    for c in chosen:
        text = cut_to_tokens(c.text, cap)
        entries.append(MemoEntry(seq=c.seq, text=text, cut=text != c.text))
        total += count_tokens(text)
    return MemoAssembly(
        entries=entries, dropped_seqs=dropped, total_tokens=total, fallbacks=fallbacks
    )


def memo_problems(kept: list[MemoCandidate], budgets: CheckpointBudgets) -> list[Problem]:
    """The kept messages over the memo's total budget (long ones count at their cut size)."""
    sizes = _kept_sizes(kept, budgets.memo_per_message)
    total = sum(sizes.values())
    if total <= budgets.memo_total:
        return []
    return [
        Problem(
            kind=ProblemKind.MEMO_OVER_BUDGET,
            part="memo",
            message=(
                f"the {len(sizes)} kept messages take {total} tokens; the memo holds at most "
                f"{budgets.memo_total}. Release (untick) messages that are withdrawn, "
                "superseded or done, or whose meaning the mind now holds completely."
            ),
        )
    ]


def memo_candidates(kept: list[RecordRow], moving: list[RecordRow], *,
                    in_turn_from: int | None = None) -> list[MemoCandidate]:
    """The memo's candidates: messages kept before, then the user's own messages moving out,
    but for those of the turn in progress (seq at or after `in_turn_from`), which are carried
    instead (`IN_TURN_RULE`). `kept` holds the memo's messages and those carried until now
    whose turn is over: every user message is in the memo, carried, or was released.

    Only the record's type says who wrote a message: a Watch's, a Task's, a callback's or
    another session's input is never a candidate, whatever its text claims.
    """
    kept_seqs = {r.seq for r in kept}
    rows = [r for r in kept if r.type == MessageType.USER] + [
        r for r in moving if r.type == MessageType.USER and r.seq not in kept_seqs
        and (in_turn_from is None or r.seq < in_turn_from)
    ]
    return [_candidate(r, r.seq in kept_seqs) for r in sorted(rows, key=lambda r: r.seq)]


def _candidate(row: RecordRow, kept_before: bool) -> MemoCandidate:
    """A message as the memo keeps it: its words, and the line of each file it carried
    (their bytes are not the memo's; the row's count included them)."""
    text = row.text_with_attachments()
    tokens = row.token_count if text == row.text else count_tokens(text)
    return MemoCandidate(seq=row.seq, text=text, tokens=tokens, kept_before=kept_before)
