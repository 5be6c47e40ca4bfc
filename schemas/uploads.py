"""A file too large for one Temporal payload, put through a session (or read from it) in
parts that never touch the session's history. Pure.

Invariants:
- A client puts a file past one part (`UPLOAD_PART_BYTES`) in parts: they go to an upload
  workflow of their own (`UPLOAD_WORKFLOW`, id `<session>.upload-<id>`), one Update each,
  a few at once (`PARTS_IN_FLIGHT`), written by an activity under the session's
  `.keel/uploads/<id>/` (Keel's folder: no tool writes it). Parts are not the session's
  files: no file history keeps them, no fork or export copies them, no rewind removes
  them. Its history holds the bytes and is gone after retention; the session's holds none.
- The session takes the file by a `StagedFile` in its put Update (a few hundred bytes):
  the same validator (its path, its size against the store's per-file limit, a session
  that stopped), then one activity that reads the parts in order, checks their count,
  size and SHA-256 against what the client sent, writes the file once (the Update's op
  id), and removes the parts. A part missing or changed refuses the put, saying so.
- An upload nobody finishes (a client that died) is dropped by its workflow after
  `UPLOAD_IDLE_S` without a part; a finished one at once.
- The way back: a read the session refuses as past one payload (`FILE_TOO_LARGE`) is read
  by a download workflow of its own (`DOWNLOAD_WORKFLOW`), part by part, each part with the
  file's version and size; parts of two versions (the agent wrote it meanwhile) start the
  read again. It writes nothing, so it ends when told or idle, with nothing to drop.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DOWNLOAD_WORKFLOW", "PARTS_IN_FLIGHT", "STAGING", "UPLOAD_IDLE_S",
           "UPLOAD_PART_BYTES", "UPLOAD_WORKFLOW", "DownloadPart", "DownloadStart",
           "FilePart", "StagedFile", "UploadPart", "UploadStart", "download_workflow_id",
           "part_path", "staging_dir", "upload_workflow_id"]

UPLOAD_WORKFLOW = "KeelUpload"
DOWNLOAD_WORKFLOW = "KeelDownload"
# base64 makes 4 of 3: a part is 480 KiB encoded, under the 512 KiB past which the SDK
# warns of a large payload (and the 1 MiB a payload may carry here:
# schemas.text.PAYLOAD_LIMIT_BYTES). A client puts a file past one part in parts.
UPLOAD_PART_BYTES = 360 * 1024
PARTS_IN_FLIGHT = 4  # parts a client sends (or asks for) at once
UPLOAD_IDLE_S = 600
_ID = re.compile(r"^[0-9a-f]{32}$")


class StagedFile(BaseModel):
    """A file put in parts: which upload, how many parts, its size and digest."""

    upload_id: str = Field(pattern=_ID.pattern)
    parts: int = Field(ge=1, le=100_000)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class UploadStart(BaseModel):
    session_id: str
    upload_id: str = Field(pattern=_ID.pattern)


class UploadPart(BaseModel):
    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    index: int = Field(ge=0, le=100_000)
    data: bytes = Field(max_length=UPLOAD_PART_BYTES)


# Where every upload stages its parts. Parts are not the session's files: they have no
# history (the workspace's history trigger skips them, infra/migrations/016), a fork or an
# export does not copy them, and a rewind leaves them as they are (an upload still running
# finishes its put).
STAGING = ".keel/uploads/"


def staging_dir(upload_id: str) -> str:
    """The folder of an upload's parts in its session's workspace (ends in /)."""
    if not _ID.match(upload_id):
        raise ValueError(f"{upload_id!r} is not an upload id")
    return f"{STAGING}{upload_id}/"


def part_path(upload_id: str, index: int) -> str:
    return f"{staging_dir(upload_id)}{index:06d}"


def upload_workflow_id(session_id: str, upload_id: str) -> str:
    return f"{session_id}.upload-{upload_id}"


def download_workflow_id(session_id: str, download_id: str) -> str:
    return f"{session_id}.download-{download_id}"


class DownloadStart(BaseModel):
    session_id: str
    path: str


class DownloadPart(BaseModel):
    index: int = Field(ge=0, le=100_000)


class FilePart(BaseModel):
    """One part of a file read in parts: its bytes, and the whole file's version and size
    as that read saw them."""

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    data: bytes
    version: int
    size: int
