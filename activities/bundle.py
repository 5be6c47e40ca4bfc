"""A session's bundle in and out of the record's database (the format: schemas.branch).

Invariants:
- An export reads one snapshot (a read-only REPEATABLE READ transaction) and writes every
  value canonically (sorted keys, timestamps in UTC as PostgreSQL's JSON renders them,
  bytea as its hex text), so the same session always gives the same bytes; a session
  imported from a bundle and exported again gives the bundle's lines (and, in the
  deployment that sealed it, its bytes: the end line's seal is this deployment's).
- The end line is sealed with this deployment's key (`seal_key`, schemas.bundle_seal). An
  import takes a bundle sealed here or by a deployment it trusts, unchanged, as it is; any
  other only with the
  importer's word (`trust`) when its agent would run or reach anything here (or with the
  importer's own agent, `agent`) or it carries long memory, and with its harness rows
  labelled as imported unverified (`unverified_rows`) unless trusted.
- A bundle holds the session's whole record (rewound rows too, with their marks), its
  checkpoints, its rewinds, its workspace's file history (from which its files as they
  stand follow), and its small state as the header; nothing of another session.
- An import is one transaction with its request id (`branch_requests`): all of it or none
  of it is written; a retry with the same request id returns what the first wrote. A
  session id in use is refused. Under a new id, the ids that must be unique across
  sessions (checkpoints, rewinds) are renamed the way a fork renames them. A user's row
  that reads as a source line gets its user's name before it, as a received one does. The
  state's config is checked as a start's would be (`check`) before anything is written.
- Long memory (a version 2 bundle, schemas.bundle_memory) never touches the vault here:
  an export reads the lines the vault's activity staged for its request
  (`bundle_memory`), in the same snapshot as the rest; an import's transaction stages the
  bundle's lines for the vault's activity to write. When that activity finds a card in
  the way, the caller undoes the import (`undo_import`) before its session ever ran.
"""

from __future__ import annotations

import gzip
import json
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

import psycopg
from psycopg import AsyncConnection

from activities.branch import LOCK_TIMEOUT
from activities.session_delete import delete_session_rows
from activities.vault.forgotten import forgotten_paths
from activities.wakeups import wakeup_schedule_id
from activities.workspace import LocalStore, StoredFile
from schemas.agent import AgentSpec
from schemas.attachments import files_tokens, stored_files_problem
from schemas.branch import (
    BUNDLE_VERSION,
    MAX_BUNDLE_BYTES,
    BranchError,
    BundleEnd,
    BundleHeader,
    ImportDone,
    bundle_line,
    check_end,
    check_header,
    line_kinds,
    line_of,
    own_config,
    renamed_checkpoint,
    unpacked,
)
from schemas.bundle_memory import (
    MEMORY_KINDS,
    MEMORY_VERSION,
    entry_problem,
    path_problem,
    renamed_entry,
    renamed_op,
)
from schemas.bundle_seal import (
    KEY_BYTES,
    KEY_NAME,
    OWN,
    acting_parts,
    check_seal,
    memory_parts,
    seal_of,
    untrusted_text,
    unverified_rows,
)
from schemas.files import normal_path, workspace_path_problem
from schemas.messages import user_display_prefix
from schemas.session import TOO_LONG_MESSAGE, SessionState, session_id_problem
from schemas.tokens import count_tokens
from schemas.vault.scope import ScopeError, check_scope

__all__ = ["drop_staged", "export_bundle", "import_bundle", "read_bundle", "seal_key",
           "undo_import"]

# A row's `rev` is this database's (migration 010): a bundle carries none.
_ROWS = ("SELECT to_jsonb(m) - 'session_id' - 'rev' FROM messages m WHERE session_id = %s"
         " ORDER BY seq")
_CHECKPOINTS = ("SELECT to_jsonb(c) - 'session_id' FROM checkpoints c WHERE session_id = %s"
                " ORDER BY record_seq, checkpoint_id")
_REWINDS = ("SELECT to_jsonb(r) - 'session_id' FROM session_rewinds r WHERE session_id = %s"
            " ORDER BY created_at, rewind_id")
_FILES = ("SELECT to_jsonb(v) - 'scope' - 'id' FROM workspace_file_versions v"
          " WHERE scope = %s ORDER BY id")
_STAGED = ("SELECT body FROM bundle_memory WHERE request_id = %s AND direction = 'export'"
           " AND kind = %s ORDER BY path, seq")


async def seal_key(conn: AsyncConnection) -> bytes:
    """This deployment's key for sealing bundles, made by the first caller that needs it
    (in the caller's transaction, or committed at once on an autocommit connection)."""
    await conn.execute("INSERT INTO deployment_keys (name, secret) VALUES (%s, %s)"
                       " ON CONFLICT (name) DO NOTHING", (KEY_NAME, secrets.token_bytes(KEY_BYTES)))
    row = await (await conn.execute("SELECT secret FROM deployment_keys WHERE name = %s",
                                    (KEY_NAME,))).fetchone()
    assert row is not None  # inserted just now, or there already
    return bytes(row[0])


async def _lines(conn: AsyncConnection, sql: str, session_id: str, kind: str) -> list[bytes]:
    cur = await conn.execute(sql, (session_id,))
    return [bundle_line(kind, r[0]) for r in await cur.fetchall()]


async def _staged(conn: AsyncConnection, request_id: str, kind: str) -> list[bytes]:
    """The memory lines of `kind` the vault's activity staged for the export."""
    cur = await conn.execute(_STAGED, (request_id, kind))
    return [bundle_line(kind, r[0]) for r in await cur.fetchall()]


async def _local_files(conn: AsyncConnection, store: LocalStore,
                       session_id: str) -> list[bytes]:
    """The file lines of a workspace kept in a local folder (no history): each file as it
    stands, at its version, written when the record's newest row was."""
    row = await (await conn.execute(
        "SELECT to_jsonb(max(created_at)) FROM messages WHERE session_id = %s",
        (session_id,))).fetchone()
    at = row[0] if row else None
    return [bundle_line("file", {"path": f.path, "version": f.version, "size": len(f.data),
                                 "data": "\\x" + f.data.hex(), "written_at": at})
            for f in sorted(await store.snapshot(session_id), key=lambda f: f.path)]


def _newest_files(files: list[dict[str, Any]]) -> list[StoredFile]:
    """The files as they stand after a bundle's file history (deletions left out)."""
    newest: dict[str, dict[str, Any]] = {}
    for f in files:
        newest[f["path"]] = f
    return [StoredFile(p, bytes.fromhex(f["data"][2:]), int(f["version"]))
            for p, f in sorted(newest.items()) if f.get("data") is not None]


async def export_bundle(database_url: str, state: SessionState,
                        local: LocalStore | None = None,
                        memory_request: str | None = None) -> bytes:
    """The bundle of `state`'s session: its record, checkpoints, rewinds and workspace
    (from `local` when the deployment keeps it in a folder), and the memory lines the
    vault staged for `memory_request` (a version 2 bundle when there are any)."""
    session_id = state.session_id
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        async with conn.transaction():
            key = await seal_key(conn)
        await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await conn.set_read_only(True)
        async with conn.transaction():
            await conn.execute("SET LOCAL TIME ZONE 'UTC'")
            found = await (await conn.execute(
                "SELECT user_name, memory_scope, origin_session, origin_seq, origin_kind"
                " FROM sessions WHERE session_id = %s", (session_id,))).fetchone()
            if found is None:
                raise BranchError(f"no session {session_id} in the record")
            parts = {kind: await _lines(conn, sql, session_id, kind) for kind, sql in (
                ("row", _ROWS), ("checkpoint", _CHECKPOINTS), ("rewind", _REWINDS),
                ("file", _FILES))}
            if local is not None:
                parts["file"] = await _local_files(conn, local, session_id)
            memory = {kind: await _staged(conn, memory_request, kind)
                      for kind in MEMORY_KINDS} if memory_request else {}
    if any(memory.values()):
        parts.update(memory)
    header = BundleHeader(
        version=MEMORY_VERSION if any(memory.values()) else BUNDLE_VERSION,
        session_id=session_id, user_name=found[0], memory_scope=found[1],
        origin_session=found[2], origin_seq=found[3], origin_kind=found[4],
        state=state.model_copy(update={"recent_outcomes": []}))
    body = [bundle_line("header", header.model_dump(mode="json"))]
    for lines in parts.values():
        body.extend(lines)
    sealed = b"".join(body)
    raw = sealed + bundle_line("end", {"counts": {k: len(v) for k, v in parts.items()},
                                       "seal": seal_of(key, sealed)})
    if len(raw) > MAX_BUNDLE_BYTES:  # an import would refuse it
        raise BranchError(f"{session_id}'s bundle would hold {len(raw):,} bytes unpacked; "
                          f"a bundle may hold at most {MAX_BUNDLE_BYTES:,}")
    return gzip.compress(raw, compresslevel=6, mtime=0)


def _file_path_problem(path: Any) -> str | None:
    """A bundle's file whose path no workspace may hold (an export writes only paths a
    store took, normalised): refused before anything is written, where the local store
    refused it after the import's transaction, leaving the session without its files."""
    if not isinstance(path, str):
        return "the bundle has a file line without its path"
    problem = workspace_path_problem(path) or (
        None if normal_path(path) == path else f"{path!r} is not a normal path")
    return f"the bundle's file: {problem}" if problem else None


class ReadBundle(NamedTuple):
    header: BundleHeader
    parts: dict[str, list[dict[str, Any]]]  # its lines' objects by kind
    end: BundleEnd
    body: bytes  # its lines before the end line, as its seal covers them


def read_bundle(bundle: bytes) -> ReadBundle:
    """A bundle's header, its lines by kind and its end; `BranchError` for what is no
    bundle."""
    raw = unpacked(bundle)
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if not lines:
        raise BranchError("the bundle is empty")
    header = check_header(lines[0])
    kinds = line_kinds(header.version)
    parts: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for line in lines[1:-1]:
        kind, item = line_of(line)
        if kind not in parts:
            raise BranchError(f"the bundle has a line of unknown kind {kind!r} (format "
                              f"version {header.version})")
        if kind in MEMORY_KINDS and (problem := path_problem(kind, str(item.get("path")))):
            raise BranchError(problem)
        if kind == "file" and (problem := _file_path_problem(item.get("path"))):
            raise BranchError(problem)
        if kind == "row" and (problem := stored_files_problem(item.get("content"))):
            raise BranchError(f"the bundle's row #{item.get('seq')}: {problem}")
        if kind == "daily" and (problem := entry_problem(item.get("seq"), item.get("text"))):
            raise BranchError(problem)
        parts[kind].append(item)
    end = check_end(lines[-1] if len(lines) > 1 else None,
                    {k: len(v) for k, v in parts.items()}, kinds)
    return ReadBundle(header, parts, end, raw[:raw.rstrip(b"\n").rfind(b"\n") + 1])


def _renamed(header: BundleHeader, parts: dict[str, list[dict[str, Any]]],
             new_id: str) -> None:
    """The ids unique across sessions, renamed for `new_id` (in place)."""
    old = header.session_id
    if old == new_id:
        return
    rewind_ids = {r["rewind_id"]: f"{r['rewind_id']}@{new_id}" for r in parts["rewind"]}
    for r in parts["rewind"]:
        r["rewind_id"] = rewind_ids[r["rewind_id"]]
    for c in parts["checkpoint"]:
        c["checkpoint_id"] = renamed_checkpoint(c["checkpoint_id"], old, new_id)
    for row in parts["row"]:
        if row.get("rewound_by") in rewind_ids:
            row["rewound_by"] = rewind_ids[row["rewound_by"]]
        content = row.get("content")
        if row["type"] == "checkpoint" and isinstance(content, dict) \
                and "checkpoint_id" in content:
            renamed = renamed_checkpoint(str(content["checkpoint_id"]), old, new_id)
            row["content"] = {**content, "checkpoint_id": renamed}
            row["input_id"] = f"checkpoint-{renamed}"
    for entry in parts.get("daily", []):
        entry["text"] = renamed_entry(str(entry["text"]), old, new_id)
    for card in parts.get("card", []):
        for op in card.get("ops", []):
            op["op_id"] = renamed_op(str(op["op_id"]), old, new_id)


def _unforged(rows: list[dict[str, Any]], user_name: str) -> None:
    """A user's row whose text reads as a source line, and has no name before it, gets its
    user's name, as the session gives one it receives (workflows.inbox): a bundle's rows
    never pass a user's words for a harness input (in place)."""
    for row in rows:
        if row["type"] != "user" or row.get("source_line"):
            continue
        text = str(row.get("content_text") or "")
        if prefix := user_display_prefix(text, user_name):
            row["source_line"] = prefix
            row["token_count"] = count_tokens(f"{prefix} {text}") + files_tokens(
                row.get("content"))


async def import_bundle(database_url: str, bundle: bytes, new_id: str | None,
                        request_id: str, local: LocalStore | None = None,
                        memory: Callable[[ImportDone], Awaitable[None]] | None = None,
                        *, trust: bool = False, agent: AgentSpec | None = None,
                        with_memory: bool = True, trusted_keys: Mapping[str, str] | None = None,
                        memory_scope: str | None = None,
                        check: Callable[[SessionState], None] | None = None) -> ImportDone:
    """The bundle's session written into this database (see the module docstring), then
    its memory written by `memory` (the caller's way to the vault; it raises, having
    undone the import, when the vault refuses), then its files into `local` when the
    deployment keeps workspaces in folders (after the transaction, again on a retry: the
    same files). `agent`: the session goes on with this agent (the importer's own) instead
    of the bundle's; `memory_scope`: it goes on in this scope instead of the bundle's (its
    memory written there); `with_memory=False`: the bundle's long memory is left out. `check`
    raises `BranchError` for a state no session here would start with; `trust`: a bundle
    not sealed here or by a deployment of `trusted_keys` (name -> public key) is taken as
    this deployment's own (schemas.bundle_seal)."""
    read = read_bundle(bundle)
    if agent is not None:
        read.header.state.take_agent(agent)
    if not with_memory:
        for kind in MEMORY_KINDS:
            read.parts[kind] = []
    if memory_scope is not None:
        try:
            read.header.memory_scope = check_scope(memory_scope)
        except ScopeError as err:
            raise BranchError(str(err)) from None
        state = read.header.state
        state.config = state.config.model_copy(update={"memory_scope": memory_scope})
    session_id = new_id or read.header.session_id
    if problem := session_id_problem(session_id):
        raise BranchError(f"{problem}; import it under another id")
    if check is not None:
        check(read.header.state)
    done = await _import(database_url, read, session_id, request_id, trust=trust,
                         own_agent=agent is not None, trusted_keys=trusted_keys or {})
    if memory is not None and (done.cards or done.entries):
        await memory(done)
    if local is not None:
        await local.restore(session_id, _newest_files(read.parts["file"]))
    return done


async def _import(database_url: str, read: ReadBundle, session_id: str, request_id: str,
                  *, trust: bool, own_agent: bool,
                  trusted_keys: Mapping[str, str]) -> ImportDone:
    header, parts = read.header, read.parts
    async with await psycopg.AsyncConnection.connect(database_url) as conn, \
            conn.transaction():
        done = await (await conn.execute(
            "SELECT kind, session_id, result FROM branch_requests WHERE request_id = %s",
            (request_id,))).fetchone()
        if done is not None:
            if (done[0], done[1]) != ("import", session_id):
                raise BranchError(f"request {request_id} made {done[0]} {done[1]}, not "
                                  f"an import as {session_id}")
            return ImportDone.model_validate(done[2])
        await conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        if await (await conn.execute("SELECT 1 FROM sessions WHERE session_id = %s",
                                     (session_id,))).fetchone():
            raise BranchError(f"session {session_id} exists already in this deployment; "
                              "import it under another id (--id)")
        found = check_seal(await seal_key(conn), read.body, read.end.seal, trusted_keys)
        unverified = 0
        try:
            if found.seal not in OWN and not trust:
                agent = [] if own_agent else acting_parts(header.state.config.agent)
                memory = memory_parts(header.state.config.memory_scope,
                                      len(parts.get("card", [])), len(parts.get("daily", [])))
                if agent or memory:
                    raise BranchError(untrusted_text(found, agent, memory))
                unverified = unverified_rows(parts["row"])
            _renamed(header, parts, session_id)
            # The name the session gives a received message (its config's, checked).
            _unforged(parts["row"], header.state.config.user_name)
        except (KeyError, TypeError, AttributeError) as err:  # a line without its fields
            raise BranchError(f"the bundle's lines are malformed ({type(err).__name__}: "
                              f"{str(err)[:200]})") from None
        result = await _write(conn, header, parts, session_id)
        result.seal, result.sealed_by = found.seal.value, found.by
        result.trusted = trust and found.seal not in OWN
        result.unverified_inputs = unverified
        await _stage_memory(conn, header, parts, session_id, request_id, result)
        await conn.execute(
            "INSERT INTO branch_requests (request_id, kind, session_id, origin_session,"
            " result) VALUES (%s, 'import', %s, %s, %s)",
            (request_id, session_id, header.session_id, result.model_dump_json()))
    return result


async def _write(conn: AsyncConnection, header: BundleHeader,
                 parts: dict[str, list[dict[str, Any]]], session_id: str) -> ImportDone:
    await conn.execute(
        "INSERT INTO sessions (session_id, user_name, memory_scope, origin_session,"
        " origin_seq, origin_kind) VALUES (%s, %s, %s, %s, %s, %s)",
        (session_id, header.user_name, header.memory_scope, header.origin_session,
         header.origin_seq, header.origin_kind))
    args = {"session": session_id}
    for table, kind in (("messages", "row"), ("checkpoints", "checkpoint"),
                        ("session_rewinds", "rewind")):
        if parts[kind]:
            await conn.execute(
                f"INSERT INTO {table} SELECT * FROM jsonb_populate_recordset(NULL::{table},"
                " (SELECT jsonb_agg(e || jsonb_build_object('session_id', %(session)s::text))"
                " FROM jsonb_array_elements(%(items)s::jsonb) e))",
                {**args, "items": json.dumps(parts[kind])})
    await conn.execute("SELECT set_config('keel.branch_copy', 'on', true)")
    if parts["file"]:
        await conn.execute(
            "INSERT INTO workspace_file_versions (scope, path, version, data, size,"
            " written_at) SELECT %(session)s, path, version, data, size, written_at"
            " FROM jsonb_populate_recordset(NULL::workspace_file_versions, %(items)s::jsonb)"
            " WITH ORDINALITY AS v ORDER BY ordinality", {**args, "items": json.dumps(
                parts["file"])})
        await conn.execute(
            "INSERT INTO workspace_files (scope, path, version, data, size, updated_at)"
            " SELECT scope, path, version, data, size, written_at FROM (SELECT DISTINCT ON"
            " (path) * FROM workspace_file_versions WHERE scope = %(session)s"
            " ORDER BY path, id DESC) v WHERE v.data IS NOT NULL", args)
    await conn.execute("SELECT set_config('keel.branch_copy', 'off', true)")
    state = _own_state(header.state, header.session_id, session_id)
    return ImportDone(session_id=session_id, bundle_session=header.session_id,
                      # The checkpoints in force, as `keel list` counts them: a bundle
                      # carries a rewound checkpoint's rows too.
                      rows=len(parts["row"]), checkpoints=state.checkpoint_count,
                      file_versions=len(parts["file"]), state=state)


def _own_state(state: SessionState, origin: str, session_id: str) -> SessionState:
    """The bundle's state as the imported session's own (in place): its ids renamed, and
    nothing that runs elsewhere claimed. The recurring wakeups' schedules are its own (made
    by the caller); a child still working answers the session that delegated to it, so the
    copy neither lists nor ends it; the copy answers no parent (a child's bundle goes on
    as a session of its own); and an ended session's copy goes on (an import starts it)."""
    if state.checkpoint_id:
        state.checkpoint_id = renamed_checkpoint(state.checkpoint_id, origin, session_id)
    state.session_id = session_id
    for wakeup in state.wakeups:
        if wakeup.schedule_id:
            wakeup.schedule_id = wakeup_schedule_id(session_id, wakeup.id)
    state.children = [c for c in state.children if c.done is not None]
    state.config = own_config(state.config)
    if state.ended:  # its origin's run was ended (on request, with its parent): this goes on
        state.ended = False
        if state.stopped_reason != TOO_LONG_MESSAGE:  # a context too long stays so
            state.stopped_reason = None
    return state


async def _stage_memory(conn: AsyncConnection, header: BundleHeader,
                        parts: dict[str, list[dict[str, Any]]], session_id: str,
                        request_id: str, result: ImportDone) -> None:
    """The bundle's memory lines staged for the vault's activity (in the import's
    transaction: staged with the session, or not at all), but the cards a person had the
    scope forget (left out, named in the result: an import never brings one back)."""
    lines = [(kind, item) for kind in MEMORY_KINDS for item in parts.get(kind, [])]
    if not lines:
        return
    scope = result.state.config.memory_scope  # the scope the session goes on in
    if scope is None:
        raise BranchError("the bundle carries long memory but its session has no memory "
                          "scope to write it in")
    forgotten = await forgotten_paths(conn, scope, [item["path"] for kind, item in lines
                                                    if kind == "card"])
    lines = [(k, item) for k, item in lines if k != "card" or item["path"] not in forgotten]
    async with conn.cursor() as cur:
        await cur.executemany(
            "INSERT INTO bundle_memory (request_id, direction, scope, session_id, kind, path,"
            " seq, body) VALUES (%s, 'import', %s, %s, %s, %s, %s, %s)",
            [(request_id, scope, session_id, kind, item["path"], int(item.get("seq", 0)),
              json.dumps(item)) for kind, item in lines])
    result.cards = sum(1 for kind, _ in lines if kind == "card")
    result.entries = len(parts.get("daily", []))
    result.forgotten_cards = forgotten


async def undo_import(database_url: str, session_id: str, request_id: str) -> None:
    """An import whose session never ran taken back whole (its memory was refused): all
    the session owns (activities.session_delete), its request and what it staged."""
    async with await psycopg.AsyncConnection.connect(database_url) as conn, \
            conn.transaction():
        await delete_session_rows(conn, session_id)
        for sql in ("DELETE FROM branch_requests WHERE request_id = %(r)s",
                    "DELETE FROM bundle_memory WHERE request_id = %(r)s"
                    " AND direction = 'import'"):
            await conn.execute(sql, {"r": request_id})


async def drop_staged(database_url: str, request_id: str) -> None:
    """What the vault staged for an export, once the export has read it."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute("DELETE FROM bundle_memory WHERE request_id = %s"
                           " AND direction = 'export'", (request_id,))
