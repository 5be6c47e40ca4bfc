"""Files a person sends with a message, written into the session's workspace store directly:
`keel send --attach`, the chat's /attach and the web UI's form. (A service sends them through
the session instead: `SessionHandle.send(..., attachments=...)`, keel._files.)

Invariants: what the session would refuse of the files (too many, one twice, a kind the model
does not take, past its limits: schemas.attachments, the session's own rules) is refused
here, in the session's words, before any file is written (`checked`); a file is read no
further than the store could take it (`read_within`); each goes where the client's would
(`schemas.attachments.upload_path`), so a file sent twice is one file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, TYPE_CHECKING

from schemas.attachments import sending_problem, upload_path
from schemas.files import limit_text

if TYPE_CHECKING:  # the store's code loads only when a file is put
    from activities.workspace import WorkspaceStore

__all__ = ["Upload", "UploadRefused", "checked", "put", "read_within"]

Upload = tuple[str, bytes]  # a workspace path and the bytes to put there


class UploadRefused(ValueError):
    """Files the session would refuse; nothing was written."""


def read_within(f: IO[bytes], name: str, most: int) -> bytes:
    """A file's bytes, never more than `most` read (one over tells it is too large)."""
    data = f.read(most + 1)
    if len(data) > most:
        raise UploadRefused(f"{limit_text(repr(name), len(data), most)}; nothing was sent")
    return data


def checked(files: Sequence[tuple[str, bytes]]) -> list[Upload]:
    """Each (name, bytes) with its workspace path, or `UploadRefused` saying why the
    session would not take them."""
    uploads = [(upload_path(name, data), data) for name, data in files]
    problem = sending_problem([path for path, _ in uploads], uploads)
    if problem:
        raise UploadRefused(f"{problem}; nothing was sent")
    return uploads


async def put(store: WorkspaceStore, session: str, uploads: Sequence[Upload]) -> list[str]:
    """The files written into the session's workspace; their paths, for the message."""
    for path, data in uploads:
        await store.write(session, path, data)
    return [path for path, _ in uploads]
