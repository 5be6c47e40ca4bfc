"""Where a tool result too large for the record, or for a Temporal payload, lives: in the
session's workspace store, under Keel's read-only `.keel/` folder.

- A result over its cap is kept whole (`keep_whole`) at `.keel/results/<call id>.txt`, or,
  when it is larger than one file may be, in numbered parts beside it
  (`<call id>.part-1.txt`, ...), each at most the store's per-file limit; the cut result in
  the record names them. Written once per call id (the op id), so a retry writes nothing.
  A background input over the input limits (schemas.input_size) is kept the same way at
  `.keel/inputs/seq-<seq>-<digest>.txt`, named by its recorded cut.
- A service tool's result larger than a payload should be is kept by the service's worker
  as the serialized Temporal payload at `payloads/<sha256>.bin` of the store's scope
  `RESULTS_SCOPE` (`write_payload`, used by `workers.payload_refs.ResultStorage`), not in
  the session's workspace: the session's quota holds the whole text once, and the agent
  never reads the raw payload. The record activity reads it back (`read_payload`), which
  checks that the reference names that scope, such a path and the bytes' own digest.
"""

from __future__ import annotations

import hashlib
import re

from temporalio.api.common.v1 import Payload

from activities.files import KEPT_INPUTS_DIR, KEPT_RESULTS_DIR
from activities.record import RecordInput
from activities.tools import workspace_path
from activities.workspace import StoreError, WorkspaceStore
from schemas.input_size import cut_line, kept_prefix, over_limits

__all__ = ["MAX_PAYLOAD_BYTES", "RESULTS_SCOPE", "cut_input", "keep_whole", "payload_path",
           "read_payload", "split_utf8", "write_payload"]

RESULTS_SCOPE = "_tool_results"  # a scope of its own, beside the sessions' workspaces
PAYLOADS_DIR = "payloads"
# The largest payload kept: 64 MiB of text, thrice over for its JSON's escapes.
MAX_PAYLOAD_BYTES = 192 * 1024 * 1024


def payload_path(digest: str) -> str:
    return f"{PAYLOADS_DIR}/{digest}.bin"


async def write_payload(store: WorkspaceStore, payload: Payload) -> dict[str, str]:
    """Keep `payload` (content-addressed: the same bytes, the same path, written once) and
    return the reference to it."""
    data = payload.SerializeToString()
    digest = hashlib.sha256(data).hexdigest()
    path = payload_path(digest)
    await store.write(RESULTS_SCOPE, path, data, op_id=f"payload-{digest}")
    return {"scope": RESULTS_SCOPE, "path": path, "sha256": digest, "size": str(len(data))}


async def read_payload(store: WorkspaceStore, ref: dict[str, str]) -> Payload:
    """The payload `ref` names; ValueError when it names no kept payload (another scope,
    another path, bytes that are not the digest's) or the payload is gone."""
    if ref.get("scope") != RESULTS_SCOPE:
        raise ValueError("the result's reference names no kept payload")
    path, digest = ref.get("path", ""), ref.get("sha256", "")
    if not re.fullmatch(r"[0-9a-f]{64}", digest) or path != payload_path(digest):
        raise ValueError("the result's reference names no kept payload")
    stored = await store.read(ref["scope"], path)
    if stored is None:
        raise ValueError(f"the result kept at {path} is not in the store")
    if hashlib.sha256(stored.data).hexdigest() != ref["sha256"]:
        raise ValueError(f"the result kept at {path} is not the one referenced")
    return Payload.FromString(stored.data)


def split_utf8(data: bytes, limit: int) -> list[bytes]:
    """`data` in pieces of at most `limit` bytes, never inside a UTF-8 character."""
    pieces: list[bytes] = []
    start = 0
    while len(data) - start > limit:
        end = start + limit
        while end > start and (data[end] & 0xC0) == 0x80:  # a continuation byte
            end -= 1
        pieces.append(data[start:end])
        start = end
    pieces.append(data[start:])
    return pieces


async def keep_whole(store: WorkspaceStore, session_id: str, call_id: str, text: str, *,
                     folder: str = KEPT_RESULTS_DIR, what: str = "result") -> str:
    """Keep `text` whole for call `call_id` (a tool's result; or, with `folder` and `what`,
    a background input's text); returns where, as the cut line says it."""
    safe = workspace_path(call_id.replace("/", "_"))
    data = text.encode(errors="replace")
    if len(data) <= store.max_file_bytes:
        path = f"{folder}/{safe}.txt"
        await store.write(session_id, path, data, op_id=f"{what}-{call_id}")
        return f"the whole {what} is in {path}; read it with read_file"
    parts = split_utf8(data, store.max_file_bytes)
    for n, part in enumerate(parts, start=1):
        await store.write(session_id, f"{folder}/{safe}.part-{n}.txt", part,
                          op_id=f"{what}-{call_id}-part-{n}")
    return (f"the whole {what} is in {len(parts)} parts, {folder}/{safe}.part-1.txt "
            f"to .part-{len(parts)}.txt; read them with read_file")


async def cut_input(store: WorkspaceStore, data: RecordInput) -> RecordInput:
    """`data` as it is recorded: a background input over its limits (`cut_over`; nobody
    to refuse it to) cut, with a line saying where the whole is kept in the session's
    workspace; anything else as it came. Named by its seq and digest: a retry writes
    nothing new."""
    limits = data.cut_over
    if limits is None or over_limits(data.text, limits) is None:
        return data
    kept = kept_prefix(data.text, limits)
    digest = hashlib.sha256(data.text.encode()).hexdigest()[:12]
    try:
        where = await keep_whole(store, data.session_id, f"seq-{data.seq}-{digest}", data.text,
                                 folder=KEPT_INPUTS_DIR, what="input")
    except StoreError as err:
        where = f"the rest could not be kept ({err})"
    return data.model_copy(update={
        "text": kept + cut_line(len(kept), len(data.text), where), "cut_over": None})
