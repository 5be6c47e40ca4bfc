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
- The images that came home are shown with the answer (`HandedHome.shown`: their paths in
  the parent's workspace, which the parent records with the answer as a message's files):
  the first `HANDBACK_SHOWN` by path that the model would take (schemas.attachments.describe)
  and that ride in one request together; the others are named in the line only.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, Field

from activities.workspace import StoreError, WorkspaceStore
from schemas.attachments import IMAGE_TYPES, Attachment, describe, files_problem, sniff
from schemas.delegation import brought
from schemas.handback import (
    HANDBACK_FILES,
    HANDBACK_SHOWN,
    HandedBack,
    destination,
    handback_line,
    is_keels,
)

__all__ = ["HandBack", "HandedHome", "hand_back"]


class HandBack(BaseModel):
    """A child's files to copy to its parent's workspace."""

    child_session: str
    parent_session: str
    call_id: str  # the parent's delegate call
    shared: list[Attachment] = Field(default_factory=list)  # the files its task carried
    only: list[str] | None = None  # the call's `bring_back` patterns; None: every file


class HandedHome(BaseModel):
    """What a hand-back did: the line the answer ends with ("" when the child wrote
    nothing), and the images that came home to show with it (paths in the parent's
    workspace)."""

    line: str = ""
    shown: list[str] = Field(default_factory=list)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def hand_back(store: WorkspaceStore, data: HandBack) -> HandedHome:
    """The child's files made or changed, copied to the parent's workspace; the line saying
    where each went, and the images to show with the answer."""
    shared = {a.path: a.sha256 for a in data.shared}
    done: list[HandedBack] = []
    shown: list[Attachment] = []
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
        if done[-1].to is not None:
            _show(shown, done[-1].to, file.data)
    return HandedHome(line=handback_line(done, data.child_session, past, kept),
                      shown=[a.path for a in shown])


def _show(shown: list[Attachment], path: str, data: bytes) -> None:
    """`path` added to the images shown with the answer when it is one the model takes
    and there is room for it (`HANDBACK_SHOWN`, one request's bytes)."""
    if len(shown) >= HANDBACK_SHOWN or sniff(data) not in IMAGE_TYPES:
        return  # a text file is not tokenized for nothing
    found = describe(path, data)
    if isinstance(found, Attachment) and files_problem([*shown, found]) is None:
        shown.append(found)


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
