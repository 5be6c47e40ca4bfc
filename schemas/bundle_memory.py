"""A bundle's long memory: the lines that carry a session's cards and its daily-note
entries (bundle format version 2, schemas.branch), and the pure rules about them.

Invariants:
- A bundle with memory lines is version 2; a bundle without is version 1, byte for byte
  what it was before memory could go along.
- The session's cards are the cards in its memory scope's vault that an op of the session
  wrote: its write_card calls (`tool:<session>:<call id>`, or `tool:<call id>` as written
  before, the ids of its assistant rows' calls) and its memory flushes
  (`flush:<session>:...`), each card as its file stands at the export.
  A card line carries the file's text and those ops, so the importing vault knows them as
  the session's and an export there finds the same cards again.
- The session's daily-note entries are its marked entries in the vault's daily files
  (`<!-- keel:<session>:<seq> -->`), word for word, ordered by file and seq; imported under
  a new id, an entry's heading and marker name the new id.
- Paths stay inside the vault's own folders: a card under `cards/`, an entry in
  `daily/YYYY-MM-DD.md`; a bundle naming any other path is refused.
- An import writes a card only where the vault has no file at its path, or one with the
  same text: a file with other text is a conflict, and any conflict refuses the import,
  naming every such file, with nothing written (`conflict_text`).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from schemas.text import has_controls
from schemas.vault.rollup import split_transcript
from schemas.vault.schema import CARDS_DIR, DAILY_DIR

__all__ = ["BUNDLE_MEMORY_WORKFLOW", "MEMORY_KINDS", "MEMORY_VERSION", "BundleMemoryDone",
           "BundleMemoryRequest", "CardLine", "CardOpLine", "DailyLine", "card_op_id",
           "conflict_text", "entry_block", "is_session_op", "owns_op", "path_problem",
           "renamed_entry", "renamed_op"]

MEMORY_VERSION = 2  # the bundle format version of a bundle with memory lines
MEMORY_KINDS = ("card", "daily")
# The workflow whose one activity, on the vault's queue, stages an export's memory lines
# or writes an import's (workflows.bundle_memory).
BUNDLE_MEMORY_WORKFLOW = "BundleMemory"

_DAILY_FILE = re.compile(rf"^{re.escape(DAILY_DIR)}/\d{{4}}-\d{{2}}-\d{{2}}\.md$")


class CardOpLine(BaseModel):
    op_id: str
    outcome: str


class CardLine(BaseModel):
    """A `card` line: one card file of the session's, and the session's ops on it."""

    path: str
    text: str
    ops: list[CardOpLine] = Field(default_factory=list)


class DailyLine(BaseModel):
    """A `daily` line: one of the session's entries in a daily file, word for word."""

    path: str
    seq: int
    text: str


class BundleMemoryRequest(BaseModel):
    """The vault activity's work: stage the memory lines of `session_id` for the export
    `request_id`, write those the import `request_id` staged, or take the session's
    daily-note entries out of the vault (a deletion: keel.deletion)."""

    request_id: str
    direction: Literal["export", "import", "forget"]
    session_id: str
    scope: str


class BundleMemoryDone(BaseModel):
    cards: int = 0
    entries: int = 0
    conflicts: list[str] = Field(default_factory=list)  # card files in the way (import)
    # An import's cards a person had this scope forget (`keel vault forget`): not written,
    # by their paths; the rest of the import goes on.
    forgotten: list[str] = Field(default_factory=list)
    # Daily files holding the session's entries that are not UTF-8 throughout (a hand
    # edit): rewriting them would change other bytes, so they are left as they are.
    unreadable: list[str] = Field(default_factory=list)


_CALL_ID = re.compile(r"[a-zA-Z0-9_-]+")  # the API's tool_use id (schemas.tools)
_FLUSH_REST = re.compile(r"\d+-\d+(:\d+)?")  # a flush's plan (from-to) or op (from-to:n)


def card_op_id(session_id: str, call_id: str) -> str:
    """The vault op of a session's write_card call. The session's id is in it: call ids are
    unique within a session only (a provider numbering its calls per reply says `call_0`
    in every session), and a scope's vault applies each op id once, so another session's
    card under the same call id was taken for written. Ops written before name the call
    alone (`tool:<call id>`)."""
    return f"tool:{session_id}:{call_id}"


def is_session_op(op_id: str, session_id: str, call_ids: set[str]) -> bool:
    """Whether a vault op is one of the session's: its write_card call (as named now, or
    before), or its flush."""
    if op_id.startswith("tool:"):
        rest = op_id[len("tool:"):]
        mine = f"{session_id}:"
        return rest in call_ids or (rest.startswith(mine) and rest[len(mine):] in call_ids)
    return op_id.startswith(f"flush:{session_id}:")


def owns_op(op_id: str, session_id: str) -> bool:
    """Whether a vault op or plan id names `session_id` as its own (its write_card calls
    as named now, its flushes), exactly: a session whose id starts with this one's
    (`a:b` beside `a`) never matches, since a call id holds no colon and a flush's rest
    is digits."""
    for kind, rest_ok in (("tool", _CALL_ID), ("flush", _FLUSH_REST)):
        prefix = f"{kind}:{session_id}:"
        if op_id.startswith(prefix) and rest_ok.fullmatch(op_id[len(prefix):]):
            return True
    return False


def renamed_op(op_id: str, old: str, new: str) -> str:
    """A session's op id under its new id (a call's id stays: the copied rows keep it)."""
    for kind in ("flush", "tool"):
        prefix = f"{kind}:{old}:"
        if owns_op(op_id, old) and op_id.startswith(prefix):
            return f"{kind}:{new}:{op_id[len(prefix):]}"
    return op_id


def renamed_entry(text: str, old: str, new: str) -> str:
    """An entry whose heading and marker name `old`, naming `new` instead."""
    if old == new:
        return text
    head, sep, rest = text.partition("\n")
    head = head.replace(f" · {old} <!-- keel:{old}:", f" · {new} <!-- keel:{new}:", 1)
    return head + sep + rest


def entry_block(text: str) -> str:
    """An entry as it is appended to a daily file (as the transcript appends one)."""
    return f"\n{text}\n"


def entry_problem(seq: object, text: object) -> str | None:
    """Why a `daily` line is not exactly one transcript entry, its own (None: it is): a
    crafted line holding a second heading and marker would append an entry the session
    never had (another speaker's, another seq's)."""
    if not isinstance(text, str) or not isinstance(seq, int):
        return "the bundle has a daily line without its seq and text"
    found = split_transcript(entry_block(text))
    if [q for _, q, _ in found] != [seq]:
        return f"the bundle's daily entry #{seq} is not one transcript entry of its own"
    return None


def path_problem(kind: str, path: str) -> str | None:
    """Why a memory line's path is not one an import may write (None: it may)."""
    parts = path.split("/")
    if path.startswith("/") or ".." in parts or "" in parts or "\\" in path \
            or has_controls(path):
        return f"the bundle's {kind} path {path!r} is not a plain path inside the vault"
    if kind == "card" and (parts[0] != CARDS_DIR or not path.endswith(".md")):
        return f"the bundle's card path {path!r} is not a card under {CARDS_DIR}/"
    if kind == "daily" and not _DAILY_FILE.match(path):
        return f"the bundle's daily path {path!r} is not a file {DAILY_DIR}/YYYY-MM-DD.md"
    return None


def conflict_text(scope: str, files: list[str]) -> str:
    return (f"the bundle's cards conflict with this deployment's vault (scope {scope!r}): "
            f"{', '.join(sorted(files))} exist there with other text. Nothing was imported "
            "and nothing in the vault changed; move those files aside and import again")
