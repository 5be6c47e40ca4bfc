"""The workspace store: a session's files, behind one narrow interface, so the next tool
call may run on another worker.

Two implementations, chosen by `KeelSettings.workspace_store`:
- `LocalStore`: a folder per session under `data_dir/workspaces` (the embedded default; one
  worker, or workers sharing that folder), named by its id (`folder_name`: a long one
  shortened with its digest).
- `PostgresStore`: the `workspace_files` table (any worker on any host).

Invariants, the same for both:
- Bytes in, bytes out: decoding, cutting and showing a file is the tools' business
  (`activities.tools._read_text`), never the store's.
- Paths are relative, normalised POSIX paths inside the scope (`clean_path`); nothing
  resolves outside it.
- Every write returns the file's new version (1, 2, ...); every read returns the version it
  saw, so the record can say which version a tool call read.
- A write with an `op_id` (the tool call that made it) is applied at most once: a retry
  finds the op and returns the version it made. A write without one (the checkpoint's two
  scratch files, restored from the database every round) is applied every time.
- Reads see the newest write of the scope (PostgreSQL: one row per file, updated in place
  under the row lock; local: the file replaced atomically).
- Size limits per file and per scope refuse a write with a `StoreLimitError` naming both
  figures; nothing is written then. A kept tool result (under `KEPT_RESULTS_PREFIX`) may be
  up to `KEPT_RESULT_MAX_BYTES` whatever the per-file limit; the scope's limit holds for it.
  The check is exact under concurrent writers (one writer per scope at a time), and its
  cost does not grow with the scope (PostgreSQL: a maintained per-scope total).
- The scope `SHARED_SCOPE` holds what every session reads (shared skills under `skills/`).
- Which AGENTS.md files a session's system prompt carries (`agents_files`, read on every
  model call, so its cost must not grow with the workspace): the one at the workspace root,
  and every other `AGENTS.md` written through the store. A write of such a file adds its
  path to the scope's index (`AGENTS_INDEX`, itself a file under `.keel/`), in the same
  lock or transaction as the write; the prompt then costs point reads of the root file, the
  index and the paths it names, never a listing. A file put in a LocalStore folder by hand
  counts only at the root. Nothing under `.keel/` counts (`is_agents_file`).
- What one model call's system prompt and tools read (`prompt_files`: the AGENTS.md files,
  the shared skills, the published vault copies) comes in one read, one round trip on
  PostgreSQL (a second only when nested AGENTS.md files are indexed): the same files as the
  separate reads give.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import shutil
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from activities.disk import atomic_write_bytes, is_partial
from schemas.config import KeelSettings, WorkspaceStoreKind
from schemas.files import limit_text, normal_path, workspace_path_problem
from schemas.uploads import STAGING

SHARED_SCOPE = "_shared"
SHARED_SKILLS = "skills/"  # a shared skill is skills/<name>/SKILL.md of the shared scope
_OPS_FILE = ".keel/store-ops.json"  # LocalStore's versions and applied ops, per scope
AGENTS_FILE = "AGENTS.md"
AGENTS_INDEX = ".keel/agents-md.json"  # the paths of the AGENTS.md files written, a JSON list
# Whole tool results (activities.files.KEPT_RESULTS_DIR) may be larger than other files: an
# MCP tool's result of up to 64 MiB is kept whole, where its cut says.
KEPT_RESULTS_PREFIX = ".keel/results/"
KEPT_RESULT_MAX_BYTES = 64 * 1024 * 1024


class StoreError(Exception):
    """A path or scope the store refuses."""


class StoreLimitError(StoreError):
    """A write over the per-file or per-workspace size limit."""


@dataclass(frozen=True)
class StoredFile:
    path: str
    data: bytes
    version: int


StoredFiles = list[StoredFile]  # (the stores' `list` method hides the builtin in them)


@dataclass(frozen=True)
class FileInfo:
    path: str
    size: int
    version: int


def clean_path(rel: str) -> str:
    """`rel` normalised inside its scope, or `StoreError` (the rule:
    schemas.files.workspace_path_problem)."""
    if problem := workspace_path_problem(rel):
        raise StoreError(problem)
    return normal_path(rel)


def is_agents_file(rel: str) -> bool:
    """Whether a (clean) path is an AGENTS.md the system prompt carries."""
    parts = rel.split("/")
    return parts[-1] == AGENTS_FILE and ".keel" not in parts


def is_skill_file(rel: str) -> bool:
    """Whether a (clean) path of the shared scope is a shared skill's SKILL.md."""
    parts = rel.split("/")
    return len(parts) == 3 and rel.startswith(SHARED_SKILLS) and parts[2] == "SKILL.md"


@dataclass(frozen=True)
class PromptFiles:
    """What a system prompt and its tools read from the store, read in one go."""

    agents: dict[str, bytes]  # the session scope's AGENTS.md files, by path
    # Of the shared scope: the paths asked for that exist, and every shared skill's SKILL.md.
    shared: dict[str, bytes]
    asked: frozenset[str] = frozenset()  # the shared paths asked for (found or not)


def _indexed(raw: bytes | None) -> list[str]:
    """The paths in an AGENTS_INDEX file (none when it is missing or unreadable)."""
    try:
        found = json.loads(raw) if raw else []
    except ValueError:
        return []
    return [p for p in found if isinstance(p, str)] if isinstance(found, list) else []


def _check_scope(scope: str) -> None:
    if not scope or "/" in scope or scope in (".", "..") or "\x00" in scope:
        raise StoreError(f"bad workspace id {scope!r}")


class WorkspaceStore(Protocol):
    max_file_bytes: int
    max_workspace_bytes: int

    async def read(self, scope: str, path: str) -> StoredFile | None: ...

    async def applied(self, scope: str, op_id: str) -> int | None:
        """The version the write `op_id` made, None when it has not been applied."""
        ...

    async def write(self, scope: str, path: str, data: bytes,
                    op_id: str | None = None) -> int: ...

    async def list(self, scope: str, prefix: str = "") -> list[FileInfo]: ...

    async def remove(self, scope: str, folder: str) -> int:
        """Every file under `folder` (a path ending in `/`) gone from the scope, with its
        versions; returns how many files there were."""
        ...

    async def agents_files(self, scope: str) -> dict[str, bytes]:
        """The AGENTS.md files of the scope (see the module docstring), by path: point
        reads, whatever the number of files."""
        ...

    async def prompt_files(self, scope: str, shared_paths: Sequence[str], *,
                           skills: bool = True) -> PromptFiles:
        """`agents_files(scope)`, the shared scope's `shared_paths` and (unless `skills` is
        False) its shared skills, in one read."""
        ...


def _limit_error(what: str, size: int, limit: int) -> StoreLimitError:
    return StoreLimitError(limit_text(what, size, limit))  # the client's wording too


class _Limits:
    max_file_bytes: int
    max_workspace_bytes: int

    def _check(self, path: str, size: int, others: int) -> None:
        limit = self.max_file_bytes
        if path.startswith(KEPT_RESULTS_PREFIX):
            limit = max(limit, KEPT_RESULT_MAX_BYTES)
        if size > limit:
            raise _limit_error(f"{path!r}", size, limit)
        if others + size > self.max_workspace_bytes:
            raise _limit_error("the workspace", others + size, self.max_workspace_bytes)


# A file system's limit on one path part is 255 bytes; a session id may be longer
# (schemas.session.MAX_SESSION_ID_BYTES).
_FOLDER_NAME_BYTES = 200


def folder_name(scope: str) -> str:
    """The folder of `scope`: its id, or for an id too long to be one path part, its start
    and its digest (ids that never had a folder of their own: a write into one failed)."""
    raw = scope.encode("utf-8", "surrogatepass")
    if len(raw) <= _FOLDER_NAME_BYTES:
        return scope
    start = raw[:100].decode("utf-8", "ignore")
    return f"{start}~{hashlib.sha256(raw).hexdigest()[:32]}"


def _folder_prefix(folder: str) -> str:
    """A folder's path as the prefix of its files' (`remove`): it must say it is a folder."""
    if not folder.endswith("/"):
        raise StoreError(f"{folder!r} is not a folder (it ends in /)")
    return clean_path(folder) + "/"


class LocalStore(_Limits):
    """A folder per scope; the shared scope is `shared_root` (the data folder)."""

    def __init__(self, root: Path, shared_root: Path, max_file_bytes: int,
                 max_workspace_bytes: int) -> None:
        self.root, self.shared_root = root, shared_root
        self.max_file_bytes, self.max_workspace_bytes = max_file_bytes, max_workspace_bytes
        self._lock = asyncio.Lock()

    @classmethod
    def of(cls, settings: KeelSettings) -> LocalStore:
        """The local store the settings describe (under their data folder)."""
        return cls(settings.workspaces_dir, settings.data_dir, settings.max_file_bytes,
                   settings.max_workspace_bytes)

    def folder(self, scope: str) -> Path:
        _check_scope(scope)
        return self.shared_root if scope == SHARED_SCOPE else self.root / folder_name(scope)

    def _file(self, scope: str, path: str) -> tuple[Path, str]:
        rel = clean_path(path)
        base = self.folder(scope).resolve()
        target = (base / rel).resolve()  # symlinks followed before the check
        if target != base and base not in target.parents:
            raise StoreError(f"{path!r} is outside the session's workspace; refused")
        return target, rel

    def _ops(self, scope: str) -> dict[str, dict[str, int]]:
        path = self.folder(scope) / _OPS_FILE
        try:
            found: dict[str, dict[str, int]] = json.loads(path.read_text())
        except (OSError, ValueError):
            found = {}
        found.setdefault("versions", {})
        found.setdefault("ops", {})
        return found

    def _save_ops(self, scope: str, ops: dict[str, dict[str, int]]) -> None:
        atomic_write_bytes(self.folder(scope) / _OPS_FILE, json.dumps(ops).encode())

    async def applied(self, scope: str, op_id: str) -> int | None:
        found = self._ops(scope)["ops"].get(op_id)
        return None if found is None else int(found)

    async def read(self, scope: str, path: str) -> StoredFile | None:
        target, rel = self._file(scope, path)
        if not target.is_file():
            return None
        data = await asyncio.to_thread(target.read_bytes)
        version = int(self._ops(scope)["versions"].get(rel, 1))
        return StoredFile(rel, data, version)

    async def write(self, scope: str, path: str, data: bytes,
                    op_id: str | None = None) -> int:
        target, rel = self._file(scope, path)
        async with self._lock:  # one worker: this process is the only writer
            ops = self._ops(scope)
            if op_id is not None and op_id in ops["ops"]:
                return int(ops["ops"][op_id])
            others = await asyncio.to_thread(self._others_size, scope, rel, ops)
            self._check(rel, len(data), others)
            await asyncio.to_thread(atomic_write_bytes, target, data)
            version = int(ops["versions"].get(rel, 0)) + 1
            ops["versions"][rel] = version
            if op_id is not None:
                ops["ops"][op_id] = version
            self._save_ops(scope, ops)
            if is_agents_file(rel) and rel != AGENTS_FILE:
                index_path = self.folder(scope) / AGENTS_INDEX
                known = _indexed(index_path.read_bytes() if index_path.is_file() else None)
                if rel not in known:
                    atomic_write_bytes(index_path, json.dumps(sorted([*known, rel])).encode())
            return version

    async def agents_files(self, scope: str) -> dict[str, bytes]:
        base = self.folder(scope)
        index_path = base / AGENTS_INDEX
        paths = [AGENTS_FILE, *_indexed(index_path.read_bytes() if index_path.is_file()
                                        else None)]
        found: dict[str, bytes] = {}
        for rel in paths:
            try:
                target, rel = self._file(scope, rel)
            except StoreError:
                continue  # an index entry that is not a path of this scope: not ours
            if is_agents_file(rel) and target.is_file():
                found[rel] = await asyncio.to_thread(target.read_bytes)
        return found

    async def prompt_files(self, scope: str, shared_paths: Sequence[str], *,
                           skills: bool = True) -> PromptFiles:
        shared: dict[str, bytes] = {}
        found_skills = [f.path for f in await self.list(SHARED_SCOPE, SHARED_SKILLS)
                        if is_skill_file(f.path)] if skills else []
        for rel in [*shared_paths, *found_skills]:
            found = await self.read(SHARED_SCOPE, rel)
            if found is not None:
                shared[found.path] = found.data
        return PromptFiles(agents=await self.agents_files(scope), shared=shared,
                           asked=frozenset(shared_paths))

    def _others_size(self, scope: str, rel: str, ops: dict[str, dict[str, int]]) -> int:
        """The bytes of the scope's other files, for the size limit. The shared scope is
        the whole data folder (the database's files too): there only what the store wrote
        counts."""
        if scope != SHARED_SCOPE:
            return sum(f.size for f in self._walk(scope) if f.path != rel)
        base = self.folder(scope)
        return sum((base / p).stat().st_size for p in ops["versions"]
                   if p != rel and (base / p).is_file())

    def _walk(self, scope: str, prefix: str = "") -> list[FileInfo]:
        base = self.folder(scope)
        # Walk only the prefix's folder: the shared scope is the whole data folder.
        start = base / prefix.rsplit("/", 1)[0] if "/" in prefix else base
        if not start.is_dir():
            return []
        versions = self._ops(scope)["versions"]
        inside = base.resolve()
        found = []
        for p in sorted(start.rglob("*")):
            rel = p.relative_to(base).as_posix()
            if not p.is_file() or rel == _OPS_FILE or not rel.startswith(prefix) \
                    or is_partial(p.name):  # a write a killed worker left half done
                continue
            if p.is_symlink() and inside not in p.resolve().parents:
                continue  # a link a person made to a host file: never read, so not listed
            found.append(FileInfo(rel, p.stat().st_size, int(versions.get(rel, 1))))
        return found

    async def list(self, scope: str, prefix: str = "") -> list[FileInfo]:
        # A walk of the folder: in a thread, so a large one never stalls the worker's loop.
        return await asyncio.to_thread(self._walk, scope, prefix)

    async def remove(self, scope: str, folder: str) -> int:
        prefix = _folder_prefix(folder)
        target, _ = self._file(scope, prefix)
        async with self._lock:
            found = await self.list(scope, prefix)
            if target.is_dir():
                await asyncio.to_thread(shutil.rmtree, target)
            ops = self._ops(scope)
            ops["versions"] = {p: v for p, v in ops["versions"].items()
                               if not p.startswith(prefix)}
            self._save_ops(scope, ops)
        return len(found)

    async def snapshot(self, scope: str) -> StoredFiles:
        """Every file of the scope as it stands, with its version, by path (a bundle's
        workspace when the deployment keeps no file history: activities.bundle), but an
        upload's staged parts (schemas.uploads.STAGING: not the session's files)."""
        found = []
        for info in await self.list(scope):
            if info.path.startswith(STAGING):
                continue
            stored = await self.read(scope, info.path)
            if stored is not None:
                found.append(stored)
        return found

    async def restore(self, scope: str, files: StoredFiles) -> None:
        """Put `files` in the scope with their versions (an import: activities.bundle);
        writing the same files again changes nothing."""
        async with self._lock:
            ops = self._ops(scope)
            for f in files:
                target, rel = self._file(scope, f.path)
                await asyncio.to_thread(atomic_write_bytes, target, f.data)
                ops["versions"][rel] = f.version
            self._save_ops(scope, ops)


class PostgresStore(_Limits):
    """The `workspace_files` / `workspace_writes` tables (infra/migrations/004), and each
    scope's total size in `workspace_scopes` (005, kept by triggers), so a write costs the
    same in a scope of ten files as in one of fifty thousand."""

    def __init__(self, database_url: str, max_file_bytes: int,
                 max_workspace_bytes: int, *, pooled: bool = True) -> None:
        self.database_url, self.pooled = database_url, pooled
        self.max_file_bytes, self.max_workspace_bytes = max_file_bytes, max_workspace_bytes

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Any]:
        """The worker's pool (activities.db); a connection of its own for a one-off caller
        such as the CLI (`pooled=False`)."""
        if self.pooled:
            from activities.db import connection

            async with connection(self.database_url) as conn:
                yield conn
            return
        import psycopg

        async with await psycopg.AsyncConnection.connect(self.database_url,
                                                         autocommit=True) as conn:
            yield conn

    async def applied(self, scope: str, op_id: str) -> int | None:
        _check_scope(scope)
        async with self._connection() as conn:
            row = await (await conn.execute(
                "SELECT version FROM workspace_writes WHERE scope=%s AND op_id=%s",
                (scope, op_id))).fetchone()
        return int(row[0]) if row else None

    async def read(self, scope: str, path: str) -> StoredFile | None:
        _check_scope(scope)
        rel = clean_path(path)
        async with self._connection() as conn:
            row = await (await conn.execute(
                "SELECT data, version FROM workspace_files WHERE scope=%s AND path=%s",
                (scope, rel))).fetchone()
        return StoredFile(rel, bytes(row[0]), int(row[1])) if row else None

    async def write(self, scope: str, path: str, data: bytes,
                    op_id: str | None = None) -> int:
        _check_scope(scope)
        rel = clean_path(path)
        async with self._connection() as conn, conn.transaction():
            # One writer per scope at a time (the scope's totals row, locked until commit):
            # the size check and the op log stay true. The total is the newest committed
            # one; what follows reads in statements of its own, after the lock.
            total = await (await conn.execute(
                "INSERT INTO workspace_scopes AS s (scope) VALUES (%s) ON CONFLICT (scope)"
                " DO UPDATE SET total_bytes = s.total_bytes RETURNING total_bytes",
                (scope,))).fetchone()
            found = await (await conn.execute(
                "SELECT (SELECT version FROM workspace_writes WHERE scope=%s AND op_id=%s),"
                " (SELECT size FROM workspace_files WHERE scope=%s AND path=%s)",
                (scope, op_id, scope, rel))).fetchone()
            assert total is not None and found is not None
            if op_id is not None and found[0] is not None:
                return int(found[0])
            self._check(rel, len(data), int(total[0]) - int(found[1] or 0))
            row = await (await conn.execute(
                "INSERT INTO workspace_files (scope, path, version, data, size)"
                " VALUES (%s, %s, 1, %s, %s) ON CONFLICT (scope, path) DO UPDATE SET"
                " version = workspace_files.version + 1, data = excluded.data,"
                " size = excluded.size, updated_at = now() RETURNING version",
                (scope, rel, data, len(data)))).fetchone()
            assert row is not None
            version = int(row[0])
            if op_id is not None:
                await conn.execute(
                    "INSERT INTO workspace_writes (scope, op_id, path, version)"
                    " VALUES (%s, %s, %s, %s)", (scope, op_id, rel, version))
            if is_agents_file(rel) and rel != AGENTS_FILE:
                await self._index_agents_file(conn, scope, rel)
            return version

    async def _index_agents_file(self, conn: Any, scope: str, rel: str) -> None:
        """Add `rel` to the scope's AGENTS_INDEX (inside the write's transaction)."""
        row = await (await conn.execute(
            "SELECT data FROM workspace_files WHERE scope=%s AND path=%s",
            (scope, AGENTS_INDEX))).fetchone()
        known = _indexed(bytes(row[0]) if row else None)
        if rel in known:
            return
        data = json.dumps(sorted([*known, rel])).encode()
        await conn.execute(
            "INSERT INTO workspace_files (scope, path, version, data, size)"
            " VALUES (%s, %s, 1, %s, %s) ON CONFLICT (scope, path) DO UPDATE SET"
            " version = workspace_files.version + 1, data = excluded.data,"
            " size = excluded.size, updated_at = now()",
            (scope, AGENTS_INDEX, data, len(data)))

    async def agents_files(self, scope: str) -> dict[str, bytes]:
        return (await self.prompt_files(scope, [], skills=False)).agents

    async def prompt_files(self, scope: str, shared_paths: Sequence[str], *,
                           skills: bool = True) -> PromptFiles:
        _check_scope(scope)
        async with self._connection() as conn:
            # One statement: the root AGENTS.md and the index, the shared files and skills.
            rows = await (await conn.execute(
                "SELECT scope, path, data FROM workspace_files"
                " WHERE (scope = %(scope)s AND path = ANY(%(agents)s))"
                " OR (scope = %(shared)s AND (path = ANY(%(paths)s) OR (%(with_skills)s"
                "  AND starts_with(path, %(skills)s) AND path LIKE %(skill_file)s)))",
                {"shared": SHARED_SCOPE, "scope": scope, "agents": [AGENTS_FILE, AGENTS_INDEX],
                 "paths": list(shared_paths), "with_skills": skills, "skills": SHARED_SKILLS,
                 "skill_file": f"{SHARED_SKILLS}%/SKILL.md"})).fetchall()
            got = {p: bytes(d) for s, p, d in rows
                   if s == scope and p in (AGENTS_FILE, AGENTS_INDEX)}
            shared = {p: bytes(d) for s, p, d in rows if s == SHARED_SCOPE
                      and (p in shared_paths or (skills and is_skill_file(p)))}
            nested = [p for p in _indexed(got.get(AGENTS_INDEX)) if is_agents_file(p)]
            if nested:
                rows = await (await conn.execute(
                    "SELECT path, data FROM workspace_files WHERE scope=%s"
                    " AND path = ANY(%s)", (scope, nested))).fetchall()
                got.update({p: bytes(d) for p, d in rows})
        return PromptFiles(agents={p: d for p, d in got.items() if is_agents_file(p)},
                           shared=shared, asked=frozenset(shared_paths))

    async def list(self, scope: str, prefix: str = "") -> list[FileInfo]:
        _check_scope(scope)
        async with self._connection() as conn:
            rows = await (await conn.execute(
                "SELECT path, size, version FROM workspace_files WHERE scope=%s"
                " AND starts_with(path, %s) ORDER BY path", (scope, prefix))).fetchall()
        return [FileInfo(p, int(s), int(v)) for p, s, v in rows]

    async def remove(self, scope: str, folder: str) -> int:
        _check_scope(scope)
        prefix = _folder_prefix(folder)
        async with self._connection() as conn, conn.transaction():
            # The scope's one writer (see write); the deletes' history rows go too.
            await conn.execute("INSERT INTO workspace_scopes AS s (scope) VALUES (%s)"
                               " ON CONFLICT (scope) DO UPDATE SET total_bytes ="
                               " s.total_bytes", (scope,))
            gone = await conn.execute("DELETE FROM workspace_files WHERE scope=%s AND"
                                      " starts_with(path, %s)", (scope, prefix))
            for table in ("workspace_file_versions", "workspace_writes"):
                await conn.execute(f"DELETE FROM {table} WHERE scope=%s AND"
                                   " starts_with(path, %s)", (scope, prefix))
        return max(gone.rowcount, 0)


def open_store(settings: KeelSettings, database_url: str | None = None, *,
               pooled: bool = True) -> WorkspaceStore:
    """The store the settings choose; `database_url` overrides theirs (the embedded stack
    knows its URL only once started); `pooled=False` for a one-off caller (the CLI)."""
    if settings.workspace_store == WorkspaceStoreKind.POSTGRES:
        url = database_url or settings.database_url
        if not url:
            raise StoreError("KEEL_WORKSPACE_STORE=postgres needs DATABASE_URL")
        return PostgresStore(url, settings.max_file_bytes, settings.max_workspace_bytes,
                             pooled=pooled)
    return LocalStore.of(settings)
