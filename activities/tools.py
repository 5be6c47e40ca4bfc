"""Tool execution: files confined to the session's workspace, skills, the record.

Files go through the workspace store (`activities.workspace`): it holds bytes and versions;
the text rules (decoding, cutting) live here in `_read_text`. A write carries the tool
call's op id, so a retried call writes once; the result's meta names the version seen.
A file read answers storable text or says why not: a binary file is described ("binary
file, N bytes, not shown") and can be read as hex by range; text keeps every character
except the NULs and lone surrogates PostgreSQL cannot hold, which are replaced and named.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection

from activities.record import load_rows
from activities.workspace import (
    SHARED_SCOPE,
    StoreError,
    WorkspaceStore,
    clean_path,
    is_skill_file,
)
from schemas.attachments import attachment_line, describe
from schemas.edits import EditError, apply_exact_edit
from schemas.messages import MessageType
from schemas.text import HEX_MAX_BYTES, describe_binary, hex_range, make_storable

MAX_READ_CHARS = 400_000
SCRATCH_DIR = ".keel"  # Keel's own files inside a workspace: readable, never writable by tools


class ToolError(Exception):
    """A tool call the agent got wrong: reported back to it as an error result."""


@dataclass
class ToolOutput:
    text: str
    is_error: bool = False
    meta: dict[str, Any] = field(default_factory=dict)


def workspace_path(rel: str, *, for_write: bool = False) -> str:
    """`rel` normalised inside the workspace (the store refuses what leaves it)."""
    if rel and "\x00" in rel:
        raise ToolError(f"{make_storable(rel)[0]!r} holds a NUL (shown as U+FFFD), which no "
                        "file name can hold; no such file")
    try:
        clean = clean_path(rel)
    except StoreError as err:
        raise ToolError(make_storable(str(err))[0]) from None
    if for_write and clean.split("/", 1)[0] == SCRATCH_DIR:
        raise ToolError(f"{rel!r} is Keel's own folder and read-only")
    return clean


def _read_bytes(data: bytes | None, rel: str) -> bytes:
    if data is None:
        raise ToolError(f"no file at {make_storable(rel)[0]!r}")
    return data


def _read_text(data: bytes | None, rel: str) -> str:
    """The file as text for editing: refused when it is binary (an edit would corrupt it)."""
    raw = _read_bytes(data, rel)
    binary = describe_binary(raw, rel)
    if binary is not None:
        raise ToolError(binary)
    return raw.decode("utf-8", errors="replace")


def read_file(stored: bytes | None, rel: str, offset: int | None = None,
              length: int | None = None) -> str:
    """What read_file answers: the text (cut at MAX_READ_CHARS), a binary file's
    description, or with `offset`/`length` a hex view of that range of bytes."""
    data = _read_bytes(stored, rel)
    if offset is not None or length is not None:
        try:
            return hex_range(data, offset or 0, length or HEX_MAX_BYTES)
        except ValueError as err:
            raise ToolError(str(err)) from err
    binary = describe_binary(data, rel)
    if binary is not None:
        return binary
    text = data.decode("utf-8", errors="replace")
    if len(text) > MAX_READ_CHARS:
        text = text[:MAX_READ_CHARS] + f"\n[file cut at {MAX_READ_CHARS} characters]"
    text, replaced = make_storable(text)
    if replaced:
        text += f"\n[Keel: {'; '.join(replaced)}]"
    return text


# A row's attached files, as a set to select from (none for a row without).
_FILES = ("jsonb_array_elements(CASE WHEN jsonb_typeof(content->'attachments') = 'array'"
          " THEN content->'attachments' END)")


def _contains(words: str) -> str:
    """An ILIKE pattern matching `words` as written: a % or _ in them is a character, not a
    wildcard ("100%" finds "100%", not every line with "100")."""
    escaped = words.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def viewable(data: bytes, path: str) -> str | None:
    """The line naming an image or a PDF the model can be shown (schemas.attachments), or
    None for any other file (text is read as text, the rest described)."""
    found = describe(path, data)
    if isinstance(found, str) or found.media_type == "text/plain":
        return None
    return attachment_line(found)


def _int_arg(args: dict[str, Any], key: str) -> int | None:
    value = args.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolError(f"argument {key!r} must be an integer")
    return value


_FRONTMATTER = re.compile(r"^---\n(.*?)\n---\n", re.S)


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    text: str


def _skill(folder: str, text: str) -> Skill:
    name, description = folder, ""
    match = _FRONTMATTER.match(text)
    if match:
        for line in match.group(1).splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "name" and value.strip():
                name = value.strip()
            elif key.strip() == "description":
                description = value.strip()
    return Skill(name, description, text)


async def load_skills(store: WorkspaceStore, packaged: Path) -> list[Skill]:
    """Every skill: the shared ones in the store (`skills/<name>/SKILL.md` of the shared
    scope), then the packaged ones; the first wins on a name clash. Every worker reads the
    same store, so every worker offers the same skills (one read: `prompt_files`)."""
    return skills_of((await store.prompt_files(SHARED_SCOPE, [])).shared, packaged)


def skills_of(shared: dict[str, bytes], packaged: Path) -> list[Skill]:
    """The skills given the shared scope's files (any others among them ignored): the
    shared ones by path, then the packaged ones; the first wins on a name clash."""
    found = [_skill(path.split("/")[1], data.decode("utf-8", errors="replace"))
             for path, data in sorted(shared.items()) if is_skill_file(path)]
    found += packaged_skills(packaged)
    seen: dict[str, Skill] = {}
    for skill in found:
        seen.setdefault(skill.name, skill)
    return list(seen.values())


@lru_cache(maxsize=4)
def packaged_skills(packaged: Path) -> tuple[Skill, ...]:
    """The skills installed with Keel: files of the package, read once per process (the
    shared ones, in the store, are read every time: a person may change them)."""
    if not packaged.is_dir():
        return ()
    return tuple(_skill(p.parent.name, p.read_text(errors="replace"))
                 for p in sorted(packaged.glob("*/SKILL.md")))


def read_skill(skills: list[Skill], name: str) -> str | None:
    return next((s.text for s in skills if s.name == name), None)


@dataclass
class ToolContext:
    session_id: str
    store: WorkspaceStore
    skills: list[Skill]
    conn: AsyncConnection
    upto_seq: int
    # In a checkpoint turn only these files (workspace paths) may change.
    editable: set[str] | None = None
    # The tool call's own id: a write under it applies once. None: every time (the
    # checkpoint's files, restored from the database before each round).
    op_id: str | None = None


async def execute_tool(ctx: ToolContext, name: str, args: dict[str, Any]) -> ToolOutput:
    try:
        return await _execute(ctx, name, args)
    except (ToolError, StoreError) as err:
        return ToolOutput(str(err), is_error=True)
    except EditError as err:
        return ToolOutput(f"edit refused: {err}", is_error=True)
    except (OSError, ValueError, TypeError, KeyError) as err:
        return ToolOutput(f"{name} failed: {err}", is_error=True)


def _str_arg(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise ToolError(f"argument {key!r} must be a string")
    return value


async def _execute(ctx: ToolContext, name: str, args: dict[str, Any]) -> ToolOutput:
    run = _TOOLS.get(name)
    if run is None:
        raise ToolError(f"unknown tool {name!r}")
    return await run(ctx, name, args)


async def _read_file(ctx: ToolContext, name: str, args: dict[str, Any]) -> ToolOutput:
    rel = _str_arg(args, "path")
    stored = await ctx.store.read(ctx.session_id, workspace_path(rel))
    meta = {"read": make_storable(rel)[0], "version": stored.version if stored else None}
    offset, length = _int_arg(args, "offset"), _int_arg(args, "length")
    if (stored and ctx.editable is None and offset is None and length is None
            and (seen := viewable(stored.data, stored.path)) is not None):
        # An image or a PDF is shown to the model with the result (the record reads it
        # from the workspace: activities.attachments.stored_files).
        return ToolOutput(f"{seen}: shown with this result",
                          meta={**meta, "images": [stored.path]})
    return ToolOutput(read_file(stored.data if stored else None, rel, offset, length),
                      meta=meta)


async def _write_file(ctx: ToolContext, name: str, args: dict[str, Any]) -> ToolOutput:
    """write_file and edit_file; in a checkpoint's turn (`ctx.editable`), edits of its
    files only."""
    rel = _str_arg(args, "path")
    editable = ctx.editable
    path = workspace_path(rel, for_write=editable is None)
    if editable is not None and path not in editable:
        raise ToolError(f"only the mind and memo files may change now, not {rel!r}")
    verb = "wrote" if name == "write_file" else "edited"
    if name == "write_file" and editable is not None:
        raise ToolError("these files can be edited, never overwritten")
    done = await ctx.store.applied(ctx.session_id, ctx.op_id) if ctx.op_id else None
    if done is not None:  # a retried call: its write is in, do not edit again
        return ToolOutput(f"{verb} {rel}", meta={"modified": rel, "version": done})
    if name == "write_file":
        data = _str_arg(args, "content").encode()
    else:
        stored = await ctx.store.read(ctx.session_id, path)
        data = apply_exact_edit(_read_text(stored.data if stored else None, rel),
                                _str_arg(args, "old_text"),
                                _str_arg(args, "new_text")).encode()
    version = await ctx.store.write(ctx.session_id, path, data, op_id=ctx.op_id)
    return ToolOutput(f"{verb} {rel}", meta={"modified": rel, "version": version})


async def _load_skill(ctx: ToolContext, name: str, args: dict[str, Any]) -> ToolOutput:
    skill = _str_arg(args, "name")
    text = read_skill(ctx.skills, skill)
    if text is None:
        known = ", ".join(s.name for s in ctx.skills) or "none"
        raise ToolError(f"no skill named {skill!r} (known: {known})")
    return ToolOutput(text, meta={"skill": skill})


async def _read_record(ctx: ToolContext, name: str, args: dict[str, Any]) -> ToolOutput:
    from_seq = int(args.get("from_seq", 1))
    limit = max(1, min(int(args.get("limit", 20)), 50))
    types = [MessageType.USER] if args.get("only_user") else None
    rows = await load_rows(ctx.conn, ctx.session_id, from_seq, ctx.upto_seq, types, limit)
    if not rows:
        return ToolOutput(f"no messages from #{from_seq}")
    return ToolOutput("\n\n".join(
        f"#{r.seq} [{r.type.value}] {r.rendered_text()}"
        + "".join(f"\n{line}" for line in r.attachment_lines()) for r in rows))


async def _search_record(ctx: ToolContext, name: str, args: dict[str, Any]) -> ToolOutput:
    query = _str_arg(args, "query").strip()
    if not query:
        raise ToolError("query is empty")
    limit = max(1, min(int(args.get("limit", 10)), 20))
    # The words, or the name of a file a message carried ("the screenshot I sent").
    cur = await ctx.conn.execute(
        f"SELECT seq, type, left(content_text, 300), (SELECT string_agg(f->>'name', ', ')"
        f" FROM {_FILES} f) FROM messages WHERE session_id=%s"
        " AND seq <= %s AND type IN ('user','harness','assistant') AND rewound_by IS NULL"
        f" AND (content_text ILIKE %s ESCAPE '\\' OR EXISTS (SELECT 1 FROM {_FILES} f"
        " WHERE f->>'name' ILIKE %s ESCAPE '\\')) ORDER BY seq DESC LIMIT %s",
        (ctx.session_id, ctx.upto_seq, _contains(query), _contains(query), limit))
    hits = await cur.fetchall()
    if not hits:
        return ToolOutput(f"nothing in the record matches {query!r}")
    return ToolOutput("\n".join(f"#{s} [{t}] {x}" + (f" [files: {names}]" if names else "")
                                 for s, t, x, names in hits))


_TOOLS: dict[str, Callable[[ToolContext, str, dict[str, Any]], Awaitable[ToolOutput]]] = {
    "read_file": _read_file, "write_file": _write_file, "edit_file": _write_file,
    "load_skill": _load_skill, "read_record": _read_record, "search_record": _search_record,
}
