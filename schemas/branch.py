"""Branching a session: the pure rules of fork, rewind and the session bundle.

Invariants:
- A branch point (a fork's `--at`, a rewind's `--to`) is a seq the session has recorded,
  and it never splits a tool round: a point after an assistant message whose tool calls
  have not all got their results by the point is refused (`round_problem`), since no
  request could be sent from there.
- The checkpoint a branch starts from is the newest live checkpoint whose recap row is at
  or before the point (`checkpoint_at`): the one the session's window started from then.
- A fork copies exactly what that window held (`copy_plan`): the rows the checkpoint
  carried from before its cut, and every live row from the cut up to the point (from seq 1
  when there is no checkpoint). Seqs are kept, so the checkpoint's cut and carried seqs
  mean the same in the fork.
- The state a branch starts from (`state_at`) points at that checkpoint: its window start,
  mind, memo and now; the next seq follows the point.
- A bundle (`BUNDLE_FORMAT`) is JSON lines, one object each, written canonically (sorted
  keys, no spaces, UTF-8: `{"data": {...}, "line": kind}`), so the same session exports
  to the same bytes. Its first line
  is the header naming the format's version; a version this Keel does not read is refused
  with that version named (`check_header`). Its last line counts what came before it, so
  a truncated bundle is refused too.
- Version 1 holds the record, checkpoints, rewinds and workspace files; version 2 is
  version 1 with the session's long memory after them (`card` and `daily` lines,
  schemas.bundle_memory). A bundle is written as version 2 only when it has memory lines,
  so a bundle without memory is the same bytes it always was; both are read.
"""

from __future__ import annotations

import json
import zlib
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator

from schemas.bundle_memory import MEMORY_KINDS, MEMORY_VERSION
from schemas.initiative import Wakeup
from schemas.session import SessionConfig, SessionState, session_id_problem
from schemas.strict import first_problem
from schemas.text import has_controls
from schemas.vault.scope import check_scope

BUNDLE_FORMAT = "keel-session-bundle"
BUNDLE_VERSION = 1  # a bundle without memory lines (with them: MEMORY_VERSION, 2)
# Each version this Keel reads (an older one would be listed here with its reader).
READABLE_VERSIONS = frozenset({1, MEMORY_VERSION})
LINE_KINDS = ("row", "checkpoint", "rewind", "file")
# The most a bundle may hold unpacked: an import reads it whole into memory, so a small
# file that unpacks to gigabytes (a gzip bomb) is refused as it unpacks, and an export
# refuses what an import would.
MAX_BUNDLE_BYTES = 1 << 30
_UNPACK_STEP = 1 << 20


def line_kinds(version: int) -> tuple[str, ...]:
    """The kinds of line a bundle of `version` holds between its header and its end."""
    return LINE_KINDS + (MEMORY_KINDS if version >= MEMORY_VERSION else ())


# The workflow that makes a fork (workflows.branch) and the type of every refusal of a
# branch (an ApplicationError's; `keel.client` maps it to BranchRefusedError).
FORK_WORKFLOW = "ForkSession"
BRANCH_REFUSED = "BranchRefused"
# Who decided a call a rewind cancelled (its `ApprovalDecision.by`): its result is the note.
REWIND_DECIDER = "rewind"


def rewind_cancelled_text(to_seq: int) -> str:
    """The result of a call that waited on a person when the session was rewound."""
    return f"cancelled: the session was rewound to #{to_seq}"


class BranchError(ValueError):
    """A branch point, bundle or target this Keel refuses; the message says why."""


class BundleVersionError(BranchError):
    """A bundle of a format version this Keel does not read."""


class BranchCheckpoint(BaseModel):
    """A stored checkpoint, as a branch needs it."""

    checkpoint_id: str
    record_seq: int
    cut_seq: int
    carried_seqs: list[int] = Field(default_factory=list)
    mind_text: str = ""
    memo_text: str = ""
    now_text: str = ""
    window_tokens_after: int = 0


class ForkCopy(BaseModel):
    request_id: str
    origin: str
    new_session: str
    at_seq: int | None = None
    checkpoint: int | None = None  # the origin's n-th checkpoint (1: the first)
    origin_state: SessionState  # the origin's state now: its config and counters


class ForkDone(BaseModel):
    session_id: str
    origin: str
    at_seq: int
    rows_copied: int
    files_copied: int
    workspace_versions: bool
    checkpoint_id: str | None = None
    state: SessionState


class RewindRequest(BaseModel):
    """The rewind update's argument: go on from `to_seq`."""

    to_seq: int


class RewindInput(BaseModel):
    session_id: str
    to_seq: int
    upto_seq: int  # the newest seq the session had given out: later inputs stay live
    rewind_id: str
    # Inputs given seqs before `upto_seq` that stay live (they came while a rewind waited
    # for the turn it cancelled to end); and a rewind's check alone, which marks nothing.
    keep_seqs: list[int] = Field(default_factory=list)
    check_only: bool = False


class RewindDone(BaseModel):
    rewind_id: str
    to_seq: int
    rows_rewound: int
    first_rewound: int | None = None
    last_rewound: int | None = None
    files_restored: int = 0
    workspace_versions: bool = True
    checkpoint: BranchCheckpoint | None = None
    checkpoint_count: int = 0


class ImportDone(BaseModel):
    session_id: str
    bundle_session: str  # the id the session had in the bundle
    rows: int
    checkpoints: int
    file_versions: int
    state: SessionState
    # Its long memory (a version 2 bundle), staged for the vault to write.
    cards: int = 0
    entries: int = 0
    # Its cards a person had the scope forget: left out of the vault (their paths).
    forgotten_cards: list[str] = Field(default_factory=list)
    # What its seal said here (schemas.bundle_seal.Seal), whether the importer's word took
    # a bundle not sealed here (nor by a deployment trusted here) as this deployment's
    # own, and how many harness inputs were labelled as imported unverified.
    seal: str = "here"
    sealed_by: str | None = None  # the trusted deployment that sealed it, by its name here
    trusted: bool = False
    unverified_inputs: int = 0


class CopyPlan(BaseModel):
    """The rows a fork copies: `carried`, and every live row in [from_seq, upto]."""

    carried: list[int] = Field(default_factory=list)
    from_seq: int = 1
    upto: int


def point_problem(point: int, last_seq: int) -> str | None:
    """Why `point` is no branch point of a session whose newest row is `last_seq`."""
    if point < 1:
        return f"seq {point} is not a seq of the record (they start at 1)"
    if point > last_seq:
        return f"seq {point} is past the newest row of the record (#{last_seq})"
    return None


def round_problem(point: int, assistant_seq: int | None, call_ids: list[str],
                  result_ids: list[str]) -> str | None:
    """Why `point` splits a tool round: `assistant_seq` is the newest live assistant row at
    or before it, `call_ids` its tool calls, `result_ids` the calls answered by live rows
    after it up to the point."""
    if assistant_seq is None:
        return None
    open_calls = [c for c in call_ids if c not in set(result_ids)]
    if not open_calls:
        return None
    return (f"seq {point} is inside a tool round: message #{assistant_seq} called "
            f"{len(open_calls)} tool(s) whose results come after it; pick #{assistant_seq - 1}"
            " or a seq after the results")


def tool_call_ids(content: Any) -> list[str]:
    """The tool calls of an assistant row's content."""
    if not isinstance(content, list):
        return []
    return [str(b["id"]) for b in content
            if isinstance(b, dict) and b.get("type") == "tool_use" and "id" in b]


def checkpoint_at(checkpoints: list[BranchCheckpoint], point: int) -> BranchCheckpoint | None:
    """The newest checkpoint (of the live ones given) whose recap row is at or before
    `point`."""
    before = [c for c in checkpoints if c.record_seq <= point]
    return max(before, key=lambda c: c.record_seq) if before else None


def copy_plan(checkpoint: BranchCheckpoint | None, point: int) -> CopyPlan:
    if checkpoint is None:
        return CopyPlan(upto=point)
    return CopyPlan(carried=sorted(s for s in checkpoint.carried_seqs
                                   if s < checkpoint.cut_seq),
                    from_seq=checkpoint.cut_seq, upto=point)


def renamed_checkpoint(checkpoint_id: str, old_session: str, new_session: str) -> str:
    """A checkpoint's id in the session `new_session` made from `old_session` (ids are
    unique across sessions: `ckpt:<session>:a<n>` keeps its shape)."""
    if old_session == new_session:
        return checkpoint_id
    prefix = f"ckpt:{old_session}:"
    if checkpoint_id.startswith(prefix):
        return f"ckpt:{new_session}:{checkpoint_id[len(prefix):]}"
    return f"{checkpoint_id}@{new_session}"


def own_config(config: SessionConfig) -> SessionConfig:
    """A branch's config (a fork's, an import's): its origin's, answering no parent: a
    sub-agent's branch goes on as a session of its own (it would answer the origin's
    parent, for a task the origin was given, and end)."""
    return config.model_copy(update={"delegated": None})


def live_wakeups(state: SessionState, now: datetime) -> list[Wakeup]:
    """The wakeups an imported session goes on with: those not expired (the session drops
    an expired one at its start; no schedule is made for it)."""
    return [w for w in state.wakeups if w.expires > now]


def state_at(session_id: str, config: SessionConfig, checkpoint: BranchCheckpoint | None,
             point: int, *, turn: int, checkpoint_count: int, checkpoint_attempts: int,
             checkpoint_id: str | None = None) -> SessionState:
    """The small state of a session that goes on from `point` (a fork's first run; the
    fields a rewind resets). `checkpoint_id`: the checkpoint's id in that session."""
    state = SessionState(session_id=session_id, config=own_config(config), next_seq=point + 1,
                         recorded_upto=point, turn=turn, checkpoint_count=checkpoint_count,
                         checkpoint_attempts=checkpoint_attempts)
    if checkpoint is not None:
        state.checkpoint_id = checkpoint_id or checkpoint.checkpoint_id
        state.window_start_seq = checkpoint.cut_seq
        state.mind_text, state.memo_text = checkpoint.mind_text, checkpoint.memo_text
        state.now_text = checkpoint.now_text
        state.context_tokens = checkpoint.window_tokens_after
    return state


# ----- the bundle ---------------------------------------------------------------------


class BundleHeader(BaseModel):
    """A bundle's first line."""

    format: str = BUNDLE_FORMAT
    version: int = BUNDLE_VERSION
    session_id: str
    user_name: str = "user"
    memory_scope: str | None = None
    origin_session: str | None = None
    origin_seq: int | None = None
    origin_kind: str | None = None
    # The session's small state as it stood (no turn running, no input waiting).
    state: SessionState

    # A bundle comes from anywhere: its ids are held to the rules of the ids they are (a
    # NUL in one reached PostgreSQL, whose error the import then said).
    @field_validator("session_id", "origin_session")
    @classmethod
    def _session_ids(cls, value: str | None) -> str | None:
        if value is not None and (problem := session_id_problem(value)):
            raise ValueError(problem)
        return value

    @field_validator("memory_scope")
    @classmethod
    def _scope(cls, value: str | None) -> str | None:
        return None if value is None else check_scope(value)

    @field_validator("user_name", "origin_kind")
    @classmethod
    def _no_controls(cls, value: str | None) -> str | None:
        if value is not None and has_controls(value):
            raise ValueError("may not hold a control character")
        return value


class BundleEnd(BaseModel):
    """A bundle's last line: how many lines of each kind came before it, and the seal of
    those lines by the deployment that wrote it (schemas.bundle_seal; none from a Keel
    before seals, or from a hand)."""

    counts: dict[str, int]
    seal: str | None = None


def bundle_line(kind: str, body: dict[str, Any]) -> bytes:
    """One line of a bundle, canonical: the same object always gives the same bytes."""
    return (json.dumps({"line": kind, "data": body}, sort_keys=True, separators=(",", ":"),
                       ensure_ascii=False) + "\n").encode()


def unpacked(bundle: bytes, limit: int = MAX_BUNDLE_BYTES) -> bytes:
    """A bundle's lines, unpacked (gzip, one member or several) up to `limit` bytes;
    `BranchError` for what is no gzip, is cut short, or unpacks to more."""
    out, data = bytearray(), bundle
    while data:
        unpacker = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            while data and not unpacker.eof:
                out += unpacker.decompress(data, _UNPACK_STEP)
                data = unpacker.unconsumed_tail
                if len(out) > limit:
                    raise BranchError(f"the bundle unpacks to more than {limit:,} bytes, "
                                      "the most a bundle may hold")
        except zlib.error as err:
            raise BranchError(f"not a Keel session bundle (not gzip: {err})") from None
        if not unpacker.eof:
            raise BranchError("not a Keel session bundle (not gzip: it ends before its "
                              "end-of-stream marker)")
        data = unpacker.unused_data
    return bytes(out)


def unsealed(bundle: bytes) -> bytes:
    """A bundle's lines with its end line's seal left out: what two deployments that hold
    the same session export alike (each seals with its own key)."""
    lines = unpacked(bundle).splitlines(keepends=True)
    kind, end = line_of(lines[-1]) if lines else ("", {})
    if kind != "end":
        raise BranchError("the bundle is cut short: its last line is not its end line")
    end.pop("seal", None)
    return b"".join([*lines[:-1], bundle_line("end", end)])


def line_of(raw: bytes) -> tuple[str, dict[str, Any]]:
    """A line's kind and its object; `BranchError` for a line that is none."""
    try:
        item = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested past what json reads
        raise BranchError("the bundle has a line that is not JSON") from None
    if not isinstance(item, dict) or not isinstance(item.get("data"), dict):
        raise BranchError("the bundle has a line that is not a bundle line")
    return str(item.get("line")), item["data"]


def check_header(line: bytes) -> BundleHeader:
    """The header of a bundle, or `BranchError` saying why it is none this Keel reads."""
    try:
        kind, raw = line_of(line)
    except BranchError:
        raise BranchError(f"not a Keel session bundle (no {BUNDLE_FORMAT} header)") from None
    if kind != "header" or raw.get("format") != BUNDLE_FORMAT:
        raise BranchError(f"not a Keel session bundle (no {BUNDLE_FORMAT} header)")
    version = raw.get("version")
    if not isinstance(version, int) or version not in READABLE_VERSIONS:
        newest = max(READABLE_VERSIONS)
        relation = "newer than" if isinstance(version, int) and version > newest else \
            "not one of"
        raise BundleVersionError(
            f"bundle format version {version!r} is {relation} the versions this Keel reads "
            f"({', '.join(str(v) for v in sorted(READABLE_VERSIONS))}); export it again "
            "with this Keel's version, or import it with the Keel that wrote it")
    try:
        return BundleHeader.model_validate(raw)
    except ValidationError as err:
        raise BranchError(f"the bundle's header is malformed: {first_problem(err)}") from None


def check_end(line: bytes | None, seen: dict[str, int],
              kinds: tuple[str, ...] = LINE_KINDS) -> BundleEnd:
    """The last line, which must count exactly the lines read (of `kinds`: the
    version's)."""
    if line is None:
        raise BranchError("the bundle is cut short: it has no end line")
    kind, raw = line_of(line)
    if kind != "end":
        raise BranchError("the bundle is cut short: its last line is not its end line")
    seal = raw.get("seal")
    try:
        end = BundleEnd.model_validate({"counts": raw.get("counts", {}),
                                        "seal": seal if isinstance(seal, str) else None})
    except ValidationError as err:
        raise BranchError(f"the bundle's end line is malformed: {first_problem(err)}") from None
    counts = end.counts
    expected = {k: counts.get(k, 0) for k in kinds}
    got = {k: seen.get(k, 0) for k in kinds}
    if expected != got:
        raise BranchError(f"the bundle does not hold what its end line counts: {got} "
                          f"against {expected}")
    return end
