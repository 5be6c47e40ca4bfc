"""A sub-agent's files copied home to its parent's workspace, with the line its answer ends
with (the rules: schemas.handback).

Invariants:
- Run once the child's task turn is over (its final reply, or its failure), by whoever
  sends the answer: the child's final model call that tells its parent
  (activities.delegate_ahead), or the child's workflow at its end (`hand_back_files`).
- Idempotent: each write carries an op id made from the call and the path, so a retried
  attempt writes nothing twice and returns the same line (a file already home has the
  child's bytes, and goes to the same path again).
- Never fails the answer: a file the parent's workspace refuses (its size limits, a path it
  cannot take) stays in the child's, named in the line with the store's words.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, Field

from activities.workspace import StoreError, WorkspaceStore
from schemas.attachments import Attachment
from schemas.delegation import brought
from schemas.handback import HANDBACK_FILES, HandedBack, destination, handback_line, is_keels

__all__ = ["HandBack", "hand_back"]


class HandBack(BaseModel):
    """A child's files to copy to its parent's workspace."""

    child_session: str
    parent_session: str
    call_id: str  # the parent's delegate call
    shared: list[Attachment] = Field(default_factory=list)  # the files its task carried
    only: list[str] | None = None  # the call's `bring_back` patterns; None: every file


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def hand_back(store: WorkspaceStore, data: HandBack) -> str:
    """The child's files made or changed, copied to the parent's workspace; the line saying
    where each went ("" when the child made none)."""
    shared = {a.path: a.sha256 for a in data.shared}
    done: list[HandedBack] = []
    past = kept = 0
    for info in sorted(await store.list(data.child_session), key=lambda f: f.path):
        if is_keels(info.path):
            continue
        if not brought(info.path, data.only):  # not asked back (if it wrote it): it stays
            kept += await _written(store, data.child_session, info.path, shared)
            continue
        if len(done) >= HANDBACK_FILES and info.path not in shared:  # not read: it stays
            past += 1
            continue
        try:
            file = await store.read(data.child_session, info.path)
        except StoreError:  # a name put in its folder by hand (a newline) it refuses
            done.append(HandedBack(repr(info.path), None, why="a name no workspace takes"))
            continue
        if file is None or shared.get(file.path) == (sha := _sha(file.data)):
            continue  # gone since the listing, or given to it and left as it was
        if len(done) >= HANDBACK_FILES:
            past += 1
            continue
        done.append(await _copy(store, data, file.path, file.data, sha, shared))
    return handback_line(done, data.child_session, past, kept)


async def _written(store: WorkspaceStore, child: str, path: str,
                   shared: dict[str, str]) -> int:
    """1 when the child made or changed `path` (0: given to it and left as it was)."""
    if path not in shared:
        return 1
    try:
        file = await store.read(child, path)
    except StoreError:
        return 1
    return int(file is not None and _sha(file.data) != shared[path])


async def _copy(store: WorkspaceStore, data: HandBack, path: str, raw: bytes, sha: str,
                shared: dict[str, str]) -> HandedBack:
    try:
        mine = await store.read(data.parent_session, path)
        theirs = None if mine is None else _sha(mine.data)
        to = destination(path, sha, shared.get(path), theirs, data.child_session,
                         data.parent_session)
        if to != path or theirs != sha:  # a file home already is not written again
            op = f"handback-{data.call_id}-{_sha(path.encode())[:16]}"
            await store.write(data.parent_session, to, raw, op_id=op)
    except StoreError as err:
        return HandedBack(path, None, why=str(err))
    return HandedBack(path, to, edited=path in shared)
