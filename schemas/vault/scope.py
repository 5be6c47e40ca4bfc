"""Memory scopes: whose long memory a session reads and writes.

Invariants:
- A scope id is a safe path component (`SCOPE_ID`): lower-case letters, digits, `.`, `_`,
  `-`, at most 64 characters, not starting with a separator, never `.` or `..`. It names a
  folder under the vaults root and a value of the `scope` column, nothing else.
- The scope comes from the session (its `SessionConfig.memory_scope`) or from the schedule
  that runs a rollup or doctor for it; never from the model's text or tool input.
- `None` means no long memory at all: no core memory, recall, transcript, flush or tools.
"""

from __future__ import annotations

import re

DEFAULT_SCOPE = "default"
SCOPE_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# Every scope PostgreSQL knows of (one column, `scope`): the index holds it, a session reads
# it, or transcripts are queued for it. With the vault folders on the vault worker's host,
# these are a deployment's scopes: a scope comes to be with its first session.
KNOWN_SCOPES_SQL = ("SELECT scope FROM memory_stats UNION SELECT memory_scope FROM sessions"
                    " WHERE memory_scope IS NOT NULL UNION SELECT scope FROM transcript_outbox")


class ScopeError(ValueError):
    """A scope id that cannot name a vault."""


def check_scope(scope: str) -> str:
    """The scope id itself, or ScopeError saying why it cannot be one."""
    if not isinstance(scope, str) or not SCOPE_ID.fullmatch(scope):
        raise ScopeError(
            f"memory scope {scope!r} is not a valid scope id (lower-case letters, digits, "
            "'.', '_', '-'; 1 to 64 characters; starting with a letter or digit)")
    return scope


def is_scope(name: str) -> bool:
    return bool(SCOPE_ID.fullmatch(name))


def unknown_scope_text(scope: str, scopes: list[str]) -> str:
    """What a person is told of a scope the deployment does not know (a mistyped one,
    never made empty): the scopes there are."""
    there = ", ".join(sorted(scopes)[:20]) or "none yet"
    return (f"no memory scope {scope!r} (the scopes: {there}); a session's first message "
            "creates its scope")


def scope_note(scope: str) -> str:
    """How a notification title names a scope: the default scope's titles stay as they were."""
    return "" if scope == DEFAULT_SCOPE else f" ({scope})"


def scope_changed(carried: str | None, given: str | None) -> str | None:
    """Why a run's input may not replace the scope the session already has, or None.

    A session's scope is fixed for its life: a continued run must name the same one."""
    if carried == given:
        return None
    return (f"this session's memory scope is {carried!r} for its whole life; a run asking "
            f"for {given!r} was refused")


# What a memory tool input may not carry: the scope is the session's, and cards are named
# by title, searches by words. A vault path (cards/..., daily/..., summaries/...), a
# climb out of a folder, a vaults-root path or a `<scope>:<path>` id all name a place.
_PLACE = re.compile(
    r"(?:^|[\s\"'(\[<])(?:\.\.[/\\]|/|~/|vaults?/|[a-z0-9][a-z0-9._-]{0,63}:"
    r"(?:cards|daily|summaries|core)\b|(?:cards|daily|summaries)/)", re.IGNORECASE)
_SCOPE_KEYS = {"scope", "memory_scope", "vault", "vault_dir", "path", "paths", "id",
               "card_id", "card_path", "tenant", "user", "owner"}
_TEXT_FIELDS = {"memory_search": ("query",), "write_card": ("title", "links", "replaces")}
# memory_get reads one document by the path memory_search gave it, within the session's own
# scope: a vault-relative path, never a scope's id, an absolute path or a climb.
_PATH_FIELDS = {"memory_get": "path"}
_NOT_OWN_PATH = re.compile(r"^(?:/|~|\\|[a-z]:[\\/]|[a-z0-9][a-z0-9._-]{0,63}:)"
                           r"|(?:^|[/\\])\.\.(?:[/\\]|$)", re.IGNORECASE)


def tool_scope_problem(tool: str, args: dict[str, object], allowed: set[str]) -> str | None:
    """Why a memory tool input is refused, or None. `allowed`: the tool's own fields.

    The session's scope decides where a memory tool looks and writes; an input that tries
    to name a scope, a vault path or a document id gets an error result, so a model cannot
    even ask for another scope's memory."""
    own = _PATH_FIELDS.get(tool)
    named = sorted(k for k in args if (k in _SCOPE_KEYS and k != own) or k not in allowed)
    if named:
        return (f"{tool} refused: it takes no {', '.join(named)}; long memory is this "
                "session's own and is chosen by the session, not by the tool input")
    path = args.get(own) if own else None
    if isinstance(path, str) and _NOT_OWN_PATH.search(path.strip()):
        return (f"{tool} refused: {own} {path[:80]!r} is not a path of this session's long "
                "memory (take one memory_search gave, as daily/DAY.md#SESSION:SEQ)")
    for key in _TEXT_FIELDS.get(tool, ()):
        value = args.get(key)
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, str) and _PLACE.search(v):
                what = "words" if tool == "memory_search" else "card titles"
                return (f"{tool} refused: {key} names a vault path or id ({v[:80]!r}); "
                        f"it takes {what} only, within this session's own memory")
    return None
