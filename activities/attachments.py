"""A message's attachments, read from the session's workspace.

Invariants:
- A message's files are described before it is numbered (`SessionActivities.
  resolve_attachments`): a file missing, of no kind the API takes, past the API's limits,
  or a message whose files with its words pass the input limits is refused to its sender
  (ATTACHMENT_REFUSED, non-retryable), and nothing is recorded.
- The row takes the very bytes that were described (`with_attachments`, when it is
  recorded): a file changed in between fails the record (AttachmentChanged, non-retryable),
  never a row whose description and bytes disagree.
- The bytes travel from the store to the record inside an activity; a workflow carries
  paths and descriptions only. A `delegate` call's files are copied from the parent's
  workspace to the child's (`share`), described as a message's are.
- An image an MCP tool returns, and a file a service tool returns, is kept the same way
  (`keep_images`, `keep_files` put it in the workspace, `stored_files` puts it in the
  result's row), its kind read from its bytes, one the model would refuse said in a line
  instead.
- A row read from the record carries its files' descriptions; a request's bytes are
  fetched for the files it sends, and held by digest (`with_bytes`, `FileBytes`): a
  window of a hundred screenshots reads twenty, once.
- A file the API refuses all the same (a header Keel read, a body the API could not) is
  marked refused in its row with the API's words (`mark_refused`), and the call asks again
  without it: one file never fails a turn, or every turn after it.
"""

from __future__ import annotations

import base64
import hashlib
import posixpath
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from psycopg import AsyncConnection
from pydantic import BaseModel, Field
from temporalio.exceptions import ApplicationError

from activities.record import RecordInput
from activities.workspace import StoreError, WorkspaceStore
from schemas.attachments import (
    IMAGE_TYPES,
    MAX_MESSAGE_ATTACHMENTS,
    Attachment,
    attachment_problem,
    attachments_of,
    describe,
    files_problem,
    sent_attachments,
    sniff,
    stored,
    upload_path,
)
from schemas.context import CARRIES_FILES
from schemas.files import normal_path, workspace_path_problem
from schemas.input_size import InputLimits
from schemas.messages import RecordRow
from schemas.session import Rejection
from schemas.tokens import count_tokens

__all__ = [
    "FILES_REFUSED",
    "FILE_BYTES",
    "FileBytes",
    "ResolveAttachments",
    "ShareFiles",
    "binary_resources",
    "keep_files",
    "keep_images",
    "keep_named",
    "mark_refused",
    "resolve",
    "share",
    "stored_files",
    "with_attachments",
    "with_bytes",
]

# What a worker holds of the files its requests send (base64 characters): a session's
# newest files, of the sessions it serves, read from the record once.
FILE_BYTES_CHARS = 128 * 1024 * 1024


class ResolveAttachments(BaseModel):
    session_id: str
    paths: list[str] = Field(default_factory=list)
    text: str = ""  # the message's words: the whole message must fit the input limits
    limits: InputLimits | None = None


def _refused(why: str) -> ApplicationError:
    return ApplicationError(f"{why}; nothing was recorded", type=Rejection.ATTACHMENT_REFUSED,
                            non_retryable=True)


async def resolve(store: WorkspaceStore, data: ResolveAttachments) -> list[Attachment]:
    """Each named file described, or the refusal its sender hears."""
    problem = attachment_problem(data.paths)
    if problem:
        raise _refused(problem)
    found = [(await _described(store, data.session_id, path, _refused,
                               "in the session's workspace (put it there first: `keel put`, "
                               "`put_file`)"))[0] for path in data.paths]
    if problem := files_problem(found):
        raise _refused(problem)
    if data.limits is not None:
        tokens = count_tokens(data.text) + sum(a.tokens for a in found)
        if tokens > data.limits.tokens:
            raise _refused(f"the message with its files is about {tokens} tokens; on this "
                           f"model one may have at most {data.limits.tokens}: send fewer "
                           "or smaller files")
    return found


async def _described(store: WorkspaceStore, session_id: str, path: str,
                     refused: Callable[[str], ApplicationError], where: str
                     ) -> tuple[Attachment, bytes]:
    """The file at `path` of `session_id`'s workspace described, with its bytes; else
    `refused(why)` raised (the store's error, no such file `where`, what the API would
    refuse of it)."""
    try:
        file = await store.read(session_id, normal_path(path))
    except StoreError as err:
        raise refused(f"{path}: {err}") from err
    if file is None:
        raise refused(f"there is no file at {path} {where}")
    described = describe(file.path, file.data)
    if isinstance(described, str):
        raise refused(described)
    return described, file.data


class ShareFiles(BaseModel):
    """A parent's `delegate` call's files, to copy into its child's workspace."""

    from_session: str
    to_session: str
    call_id: str
    paths: list[str] = Field(default_factory=list)


async def share(store: WorkspaceStore, data: ShareFiles) -> list[Attachment]:
    """Each file described from the parent's workspace, then copied to the same path in
    the child's (once per call: the write's op id), for the child's task to carry; or
    FILES_REFUSED (non-retryable) naming the file and why, with nothing copied."""
    found = [await _described(store, data.from_session, path, _refused_share,
                              "in your workspace") for path in data.paths]
    if problem := files_problem([a for a, _ in found]):
        raise _refused_share(problem)
    for i, (item, raw) in enumerate(found):
        await store.write(data.to_session, item.path, raw, op_id=f"share-{data.call_id}-{i}")
    return [a for a, _ in found]


FILES_REFUSED = "FilesRefused"


def _refused_share(why: str) -> ApplicationError:
    return ApplicationError(why, type=FILES_REFUSED, non_retryable=True)


async def with_attachments(store: WorkspaceStore, data: RecordInput) -> RecordInput:
    """`data` with its files' bytes in its row (`content`) and their estimate in its
    count; `data` as it came when it names none."""
    if not data.attachments:
        return data
    items = []
    for item in data.attachments:
        file = await store.read(data.session_id, item.path)
        if file is None or hashlib.sha256(file.data).hexdigest() != item.sha256:
            raise ApplicationError(
                f"{item.path} changed in the session's workspace while the message was "
                "sent; send it again", type="AttachmentChanged", non_retryable=True)
        items.append(stored(item, file.data))
    return data.model_copy(update={
        "content": {"attachments": items},
        "extra_tokens": sum(a.tokens for a in data.attachments)})


async def mark_refused(conn: AsyncConnection, session_id: str, rows: list[RecordRow],
                       seq: int, index: int, reason: str) -> list[RecordRow]:
    """The API refused the attached file `index` of the message at `seq`: the record says
    so (the row keeps the file; no request sends it again, and its line says why), and
    `rows` come back with it so marked, to ask again without it."""
    await conn.execute(
        "UPDATE messages SET content = jsonb_set(content, ARRAY['attachments', %s, 'refused'],"
        " to_jsonb(%s::text)) WHERE session_id = %s AND seq = %s",
        (str(index), reason or "refused", session_id, seq))
    marked = []
    for row in rows:
        if row.seq == seq and isinstance(row.content, dict):
            items = [dict(item) for item in attachments_of(row.content)]
            items[index]["refused"] = reason or "refused"
            row = row.model_copy(update={"content": {**row.content, "attachments": items}})
        marked.append(row)
    return marked


NAME_SHOWN = 80  # of a tool's file's name, in the line that says it was not shown

# What a tool's image is called in the workspace: the tool's name and its place.
_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif",
               "image/webp": "webp"}


async def keep_images(store: WorkspaceStore, session_id: str, call_id: str, tool: str,
                      blocks: list[Any]) -> tuple[list[str], list[str]]:
    """The images among an MCP result's `blocks`, and its embedded binary resources (a
    PDF, an image, text), put in the session's workspace (once per call: the write's op
    id), for the record to send with the result; and a line for each one that is not
    (undecodable, of no kind the model takes, past its limits, past
    MAX_MESSAGE_ATTACHMENTS), saying why. Their kind is read from their bytes, never the
    server's label."""
    found: list[tuple[str, str, bytes | None, bool]] = []
    images = [b for b in blocks if getattr(b, "type", "") == "image"]
    for i, block in enumerate(images):
        what = f"image {i + 1} ({getattr(block, 'mime_type', '') or '?'})"
        data = _base64(str(getattr(block, "data", "")), urlsafe=False)
        kind = sniff(data or b"") or ""
        found.append((what, f"{tool}-{call_id[-8:]}-{i + 1}.{_EXTENSIONS.get(kind, 'bin')}",
                      data, True))
    for i, resource in enumerate(binary_resources(blocks)):
        uri = str(getattr(resource, "uri", ""))
        name = posixpath.basename(uri.split("?", 1)[0].rstrip("/")) or f"resource-{i + 1}"
        shown = "".join(c if c.isprintable() else "?" for c in uri[:NAME_SHOWN])
        found.append((f"resource {shown}", name,
                      _base64(str(getattr(resource, "blob", "")), urlsafe=False), False))
    return await keep_named(store, session_id, f"image-{call_id}", found)


def binary_resources(blocks: list[Any]) -> list[Any]:
    """The binary contents of an MCP result's embedded resources (`blob`, base64)."""
    return [b.resource for b in blocks if getattr(b, "type", "") == "resource"
            and getattr(getattr(b, "resource", None), "blob", None) is not None]


async def keep_files(store: WorkspaceStore, session_id: str, call_id: str,
                     files: list[dict[str, str]]) -> tuple[list[str], list[str]]:
    """A service tool's files (`schemas.agent.result_files`: names and base64) put in the
    session's workspace, as `keep_images` puts an MCP tool's images: images, PDFs and
    text, each under its own name; a line for each that is not, saying why."""
    found: list[tuple[str, str, bytes | None, bool]] = []
    for i, file in enumerate(files):
        name = posixpath.basename(file["name"].replace("\\", "/"))
        name = f"file-{i + 1}" if name in ("", ".", "..") else name
        shown = "".join(c if c.isprintable() else "?" for c in name[:NAME_SHOWN])
        found.append((f"file {i + 1} ({shown})", name,
                      _base64(file["data"], urlsafe=True), False))
    return await keep_named(store, session_id, f"file-{call_id}", found)


def _base64(text: str, *, urlsafe: bool) -> bytes | None:
    """Bytes of base64 `text` (with `urlsafe`, of either alphabet, padding optional: what
    pydantic writes), None when it is not base64."""
    if urlsafe:
        text = text.translate(str.maketrans("-_", "+/"))
        text += "=" * (-len(text) % 4)
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        return None


async def keep_named(store: WorkspaceStore, session_id: str, op: str,
                     found: list[tuple[str, str, bytes | None, bool]]
                     ) -> tuple[list[str], list[str]]:
    """Each (what, name, bytes, images only) a tool returned put in the workspace under
    `upload_path`, its op id `op` and its place; or a line saying why not (`what` names
    it there; "images only": another kind is refused too). At most
    MAX_MESSAGE_ATTACHMENTS are kept and as many lines said; the rest are one line (a
    result of ten thousand files is read no further than that, and its text stays short)."""
    paths: list[str] = []
    said: list[str] = []
    kept: list[Attachment] = []
    for i, (what, name, data, images_only) in enumerate(found):
        if len(paths) >= MAX_MESSAGE_ATTACHMENTS or len(said) >= MAX_MESSAGE_ATTACHMENTS:
            said.append(f"[{len(found) - i} more not shown: a result shows at most "
                        f"{MAX_MESSAGE_ATTACHMENTS} files, and says why of as many]")
            break
        if data is None:
            said.append(f"[{what} not shown: its data is not base64]")
            continue
        made = describe(name, data)
        kind = sniff(data) or ""
        if isinstance(made, str) or (images_only and kind not in IMAGE_TYPES):
            why = made if isinstance(made, str) else f"{name} is {kind or 'no image'}"
            said.append(f"[{what} not shown: {why}]")
        elif too_much := files_problem([*kept, made]):
            said.append(f"[{what} not shown: {too_much}]")
        elif problem := workspace_path_problem(path := upload_path(name, data)):
            said.append(f"[{what} not shown: {problem}]")
        else:
            try:
                await store.write(session_id, path, data, op_id=f"{op}-{i}")
            except StoreError as err:
                said.append(f"[{what} not shown: {err}]")
                continue
            paths.append(path)
            kept.append(made)
    return paths, said


async def stored_files(store: WorkspaceStore, session_id: str, paths: list[str]
                       ) -> tuple[list[dict[str, Any]], list[str]]:
    """The files at `paths` as a row stores them (described, with their bytes), and a line
    for each that is gone or refused (a tool's images, put by `keep_images`)."""
    items: list[dict[str, Any]] = []
    said: list[str] = []
    for path in paths:
        file = await store.read(session_id, normal_path(path))
        made = describe(path, file.data) if file is not None else f"{path} is gone"
        if isinstance(made, str):
            said.append(f"[image not shown: {made}]")
        else:
            items.append(stored(made, file.data if file is not None else b""))
    return items, said


class FileBytes:
    """A worker's copy of the files its requests send, as base64 by digest: a session
    sends its newest files in every call, so they are read from the record once. Bounded
    (`max_chars`), the least recently sent dropped first; thread-safe."""

    def __init__(self, max_chars: int = FILE_BYTES_CHARS) -> None:
        self.max_chars = max_chars
        self._held: OrderedDict[str, str] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    @property
    def chars(self) -> int:
        return self._chars

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._chars = 0

    def get(self, sha256: str) -> str | None:
        with self._lock:
            found = self._held.get(sha256)
            if found is not None:
                self._held.move_to_end(sha256)
            return found

    def keep(self, sha256: str, data: str) -> None:
        with self._lock:
            if sha256 in self._held or len(data) > self.max_chars:
                return
            self._held[sha256] = data
            self._chars += len(data)
            while self._chars > self.max_chars:
                _, dropped = self._held.popitem(last=False)
                self._chars -= len(dropped)


FILE_BYTES = FileBytes()


async def with_bytes(conn: AsyncConnection, session_id: str, rows: list[RecordRow],
                     held: FileBytes = FILE_BYTES) -> list[RecordRow]:
    """`rows` (descriptions: activities.record.ROW_COLUMNS) with the bytes of the files a
    request of them sends (schemas.attachments.sent_attachments), from `held` or, for
    those it does not hold, the record in one statement."""
    wanted = sent_attachments([(r.seq, r.content) for r in rows if r.type in CARRIES_FILES],
                              loaded_only=False)
    if not wanted:
        return rows
    by_seq = {r.seq: r for r in rows}
    found: dict[tuple[int, int], str] = {}
    missing: list[tuple[int, int]] = []
    for seq, i in wanted:
        item = attachments_of(by_seq[seq].content)[i]
        data = item.get("data") or held.get(str(item.get("sha256")))
        if data:
            found[seq, i] = data
        else:
            missing.append((seq, i))
    if missing:
        for seq, i, data in await (await conn.execute(
                "SELECT w.seq, w.i, m.content->'attachments'->w.i->>'data' FROM messages m"
                " JOIN unnest(%s::bigint[], %s::int[]) AS w(seq, i) ON m.seq = w.seq"
                " WHERE m.session_id = %s", ([s for s, _ in missing], [i for _, i in missing],
                                              session_id))).fetchall():
            if data:
                found[seq, i] = data
                held.keep(str(attachments_of(by_seq[seq].content)[i].get("sha256")), data)
    return [_filled(row, found) for row in rows]


def _filled(row: RecordRow, found: dict[tuple[int, int], str]) -> RecordRow:
    items = attachments_of(row.content)
    if not isinstance(row.content, dict) or not any((row.seq, i) in found
                                                    for i in range(len(items))):
        return row
    filled = [item | {"data": found[row.seq, i]} if (row.seq, i) in found else item
              for i, item in enumerate(items)]
    return row.model_copy(update={"content": {**row.content, "attachments": filled}})
