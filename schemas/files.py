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

These models travel in Temporal histories: add fields only as optional with defaults.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from schemas.text import PAYLOAD_LIMIT_BYTES

# base64 makes 4 bytes of 3: the encoded file fits the payload budget of one message.
FILE_CALL_MAX_BYTES = PAYLOAD_LIMIT_BYTES * 3 // 4
_BYTES_AS_BASE64 = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")


def limit_text(what: str, size: int, limit: int) -> str:
    """The sentence for `what` over a size limit (a file by its quoted path, or "the
    workspace")."""
    return f"{what} would be {size:,} bytes; the limit is {limit:,} bytes"


def put_problem(path: str, size: int, max_file_bytes: int) -> str | None:
    """Why a file of `size` bytes cannot be put at `path` through the session, or None:
    the store's per-file limit, then what one Temporal payload can carry."""
    if size > max_file_bytes:
        return limit_text(repr(path), size, max_file_bytes)
    if size > FILE_CALL_MAX_BYTES:
        return (f"{limit_text(repr(path), size, FILE_CALL_MAX_BYTES)} for a file sent "
                "through the session (Temporal's payload limit); copy it in with "
                "`keel put`, which writes the store directly")
    return None


def read_problem(path: str, size: int) -> str | None:
    if size > FILE_CALL_MAX_BYTES:
        return (f"{path!r} has {size:,} bytes, more than the {FILE_CALL_MAX_BYTES:,} a read "
                "through the session can carry (Temporal's payload limit); save it with "
                "`keel files SESSION PATH --out FILE`, which reads the store directly")
    return None


class PutFile(BaseModel):
    model_config = _BYTES_AS_BASE64

    path: str
    data: bytes


class ReadFile(BaseModel):
    path: str


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
