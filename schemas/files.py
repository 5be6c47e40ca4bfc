"""A session's workspace files as a client sees them: the contracts of the session's file
Updates (`Handler.PUT_FILE`, `READ_FILE`, `LIST_FILES`) and the size rules both ends apply.
No I/O.

Invariants:
- One wording for a size over a limit (`limit_text`): the workspace store raises it, and
  `keel.client` raises the same sentence before sending, so a caller reads one message
  wherever the check happened.
- A file's bytes travel inside Temporal payloads (the update's request and an activity's
  input, in one workflow task): at most `FILE_CALL_MAX_BYTES`, base64 included within
  schemas.text's payload budget. Larger files go through `keel put` / `keel files`, which
  use the store directly.
- Bytes travel as URL-safe base64 in JSON (a plain-JSON client sends and reads them so).
- One rule for a path (`workspace_path_problem`, `normal_path`): relative, inside its
  workspace, no control character, a name both stores (and a filesystem) can hold. The
  stores, the agent's tools and an imported bundle's files all answer to it.

These models travel in Temporal histories: add fields only as optional with defaults.
"""

from __future__ import annotations

import posixpath

from pydantic import BaseModel, ConfigDict, Field

from schemas.text import PAYLOAD_LIMIT_BYTES, has_controls
from schemas.uploads import StagedFile

# base64 makes 4 bytes of 3: the encoded file fits the payload budget of one message.
FILE_CALL_MAX_BYTES = PAYLOAD_LIMIT_BYTES * 3 // 4
_BYTES_AS_BASE64 = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")


# A file's path in a workspace, in UTF-8 bytes: each part (a folder's or file's name) and
# the whole. Both stores hold the same names: a part must leave room, under a filesystem's
# 255, for the local store's temporary name beside it.
MAX_PATH_PART_BYTES = 200
MAX_PATH_BYTES = 1_024


def normal_path(rel: str) -> str:
    """`rel` as the stores keep it: POSIX separators, `.` and `..` resolved."""
    return posixpath.normpath(rel.replace("\\", "/"))


def workspace_path_problem(rel: str) -> str | None:
    """Why `rel` cannot name a file of a workspace, or None: empty, outside it, a control
    character (a newline in a name would forge a line of a listing, or of the system
    prompt's AGENTS.md headings), a name past what the local store can hold."""
    if not rel or "\x00" in rel:
        return "a path is required"
    if has_controls(rel):
        return (f"{rel!r}: a path may not hold a control character (a newline, a tab, an "
                "escape); refused")
    norm = normal_path(rel)
    if norm.startswith("/") or norm == ".." or norm.startswith("../") or norm == ".":
        return f"{rel!r} is outside the session's workspace; refused"
    longest = max(len(part.encode("utf-8")) for part in norm.split("/"))
    if len(norm.encode("utf-8")) > MAX_PATH_BYTES or longest > MAX_PATH_PART_BYTES:
        shown = repr(rel) if len(rel) <= 80 else repr(rel[:80]) + "…"
        return (f"{shown}: a path may have at most {MAX_PATH_BYTES:,} bytes, each name in it "
                f"{MAX_PATH_PART_BYTES}; refused")
    return None


def limit_text(what: str, size: int, limit: int) -> str:
    """The sentence for `what` over a size limit (a file by its quoted path, or "the
    workspace")."""
    return f"{what} would be {size:,} bytes; the limit is {limit:,} bytes"


def put_problem(path: str, size: int, max_file_bytes: int) -> str | None:
    """Why a file of `size` bytes cannot be put at `path` through the session, or None:
    the store's per-file limit (a file past one payload goes in parts: schemas.uploads)."""
    if size > max_file_bytes:
        return limit_text(repr(path), size, max_file_bytes)
    return None


def read_problem(path: str, size: int, at_most: int | None = None) -> str | None:
    """Why a file of `size` bytes is not read in one call: past one payload, or past what
    the caller asked for at most (keel.client reads a larger file in parts)."""
    limit = min(FILE_CALL_MAX_BYTES, at_most or FILE_CALL_MAX_BYTES)
    if size > limit:
        return (f"{path!r} has {size:,} bytes, more than the {limit:,} a read through the "
                "session carries in one call (Temporal's payload limit, or the caller's): "
                "SessionHandle.read_file reads it in parts; `keel files SESSION PATH --out "
                "FILE` reads the store directly")
    return None


class PutFile(BaseModel):
    """A put: the file's bytes, or (a file past one payload) the upload whose parts they
    are (schemas.uploads). `data` is None then, so a worker from before uploads refuses
    the put instead of writing an empty file."""

    model_config = _BYTES_AS_BASE64

    path: str
    data: bytes | None = None
    staged: StagedFile | None = None


class ReadFile(BaseModel):
    path: str
    # Refuse as too large (FILE_TOO_LARGE) past this many bytes: the caller reads such a
    # file in parts, outside the session's history (None: one payload's worth).
    at_most: int | None = Field(default=None, ge=1)


class ListFiles(BaseModel):
    prefix: str = ""


class FileVersion(BaseModel):
    """What a put made: the file's new version (1, 2, ...)."""

    path: str
    version: int
    size: int


class FileData(BaseModel):
    """A file's bytes and the version they are."""

    model_config = _BYTES_AS_BASE64

    path: str
    data: bytes
    version: int


class FileEntry(BaseModel):
    path: str
    size: int
    version: int
