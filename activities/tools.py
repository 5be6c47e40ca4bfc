"""Tool execution: files confined to the session's workspace, skills, the record.

A file read answers storable text or says why not: a binary file is described ("binary
file, N bytes, not shown") and can be read as hex by range; text keeps every character
except the NULs and lone surrogates PostgreSQL cannot hold, which are replaced and named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection

from activities.record import load_rows
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


def workspace_path(workspace: Path, rel: str, *, for_write: bool = False) -> Path:
    """Resolve `rel` inside `workspace`; symlinks are followed before the check."""
    if not rel:
        raise ToolError("a path is required")
    if "\x00" in rel:
        raise ToolError(f"{make_storable(rel)[0]!r} holds a NUL (shown as U+FFFD), which no "
                        "file name can hold; no such file")
    root = workspace.resolve()
    target = (root / rel).resolve()
    if target != root and root not in target.parents:
        raise ToolError(f"{make_storable(rel)[0]!r} is outside the session's workspace; "
                        "refused")
    if for_write:
        rel_parts = target.relative_to(root).parts
        if rel_parts and rel_parts[0] == SCRATCH_DIR:
            raise ToolError(f"{rel!r} is Keel's own folder and read-only")
    return target


def _read_bytes(path: Path, rel: str) -> bytes:
    if not path.is_file():
        raise ToolError(f"no file at {make_storable(rel)[0]!r}")
    return path.read_bytes()


def _read_text(path: Path, rel: str) -> str:
    """The file as text for editing: refused when it is binary (an edit would corrupt it)."""
    data = _read_bytes(path, rel)
    binary = describe_binary(data, rel)
    if binary is not None:
        raise ToolError(binary)
    return data.decode("utf-8", errors="replace")


def read_file(path: Path, rel: str, offset: int | None = None,
              length: int | None = None) -> str:
    """What read_file answers: the text (cut at MAX_READ_CHARS), a binary file's
    description, or with `offset`/`length` a hex view of that range of bytes."""
    data = _read_bytes(path, rel)
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


def _int_arg(args: dict[str, Any], key: str) -> int | None:
    value = args.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolError(f"argument {key!r} must be an integer")
    return value


_FRONTMATTER = re.compile(r"^---\n(.*?)\n---\n", re.S)


def skill_catalog(skills_dirs: list[Path]) -> list[tuple[str, str, Path]]:
    """(name, description, path) of every SKILL.md; the first folder wins on a name clash."""
    seen: dict[str, tuple[str, str, Path]] = {}
    for base in skills_dirs:
        if not base.is_dir():
            continue
        for skill_md in sorted(base.glob("*/SKILL.md")):
            name, description = skill_md.parent.name, ""
            match = _FRONTMATTER.match(skill_md.read_text(errors="replace"))
            if match:
                for line in match.group(1).splitlines():
                    key, _, value = line.partition(":")
                    if key.strip() == "name" and value.strip():
                        name = value.strip()
                    elif key.strip() == "description":
                        description = value.strip()
            seen.setdefault(name, (name, description, skill_md))
    return list(seen.values())


def read_skill(skills_dirs: list[Path], name: str) -> str | None:
    for skill_name, _, path in skill_catalog(skills_dirs):
        if skill_name == name:
            return path.read_text(errors="replace")
    return None


@dataclass
class ToolContext:
    session_id: str
    workspace: Path
    skills_dirs: list[Path]
    conn: AsyncConnection
    upto_seq: int
    # In a checkpoint turn only these files may change.
    editable: set[Path] | None = None


async def execute_tool(ctx: ToolContext, name: str, args: dict[str, Any]) -> ToolOutput:
    try:
        return await _execute(ctx, name, args)
    except ToolError as err:
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
    if name == "read_file":
        rel = _str_arg(args, "path")
        return ToolOutput(read_file(workspace_path(ctx.workspace, rel), rel,
                                    _int_arg(args, "offset"), _int_arg(args, "length")),
                          meta={"read": make_storable(rel)[0]})
    if name in ("write_file", "edit_file"):
        rel = _str_arg(args, "path")
        editable = ctx.editable
        if editable is not None:
            path = workspace_path(ctx.workspace, rel)
            if path not in editable:
                raise ToolError(f"only the mind and memo files may change now, not {rel!r}")
        else:
            path = workspace_path(ctx.workspace, rel, for_write=True)
        if name == "write_file":
            if editable is not None:
                raise ToolError("these files can be edited, never overwritten")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(_str_arg(args, "content"))
            return ToolOutput(f"wrote {rel}", meta={"modified": rel})
        text = _read_text(path, rel)
        path.write_text(apply_exact_edit(text, _str_arg(args, "old_text"),
                                         _str_arg(args, "new_text")))
        return ToolOutput(f"edited {rel}", meta={"modified": rel})
    if name == "load_skill":
        skill = _str_arg(args, "name")
        text = read_skill(ctx.skills_dirs, skill)
        if text is None:
            known = ", ".join(n for n, _, _ in skill_catalog(ctx.skills_dirs)) or "none"
            raise ToolError(f"no skill named {skill!r} (known: {known})")
        return ToolOutput(text, meta={"skill": skill})
    if name == "read_record":
        from_seq = int(args.get("from_seq", 1))
        limit = max(1, min(int(args.get("limit", 20)), 50))
        types = [MessageType.USER] if args.get("only_user") else None
        rows = await load_rows(ctx.conn, ctx.session_id, from_seq, ctx.upto_seq, types, limit)
        if not rows:
            return ToolOutput(f"no messages from #{from_seq}")
        return ToolOutput("\n\n".join(
            f"#{r.seq} [{r.type.value}] {r.rendered_text()}" for r in rows))
    if name == "search_record":
        query = _str_arg(args, "query").strip()
        if not query:
            raise ToolError("query is empty")
        limit = max(1, min(int(args.get("limit", 10)), 20))
        cur = await ctx.conn.execute(
            "SELECT seq, type, left(content_text, 300) FROM messages WHERE session_id=%s"
            " AND seq <= %s AND type IN ('user','harness','assistant')"
            " AND content_text ILIKE %s ORDER BY seq DESC LIMIT %s",
            (ctx.session_id, ctx.upto_seq, f"%{query}%", limit))
        hits = await cur.fetchall()
        if not hits:
            return ToolOutput(f"nothing in the record matches {query!r}")
        return ToolOutput("\n".join(f"#{s} [{t}] {x}" for s, t, x in hits))
    raise ToolError(f"unknown tool {name!r}")
