"""The vault as the UI shows it: CORE.md, the cards by type with their History, today's
transcript, and a search over `activities.vault.search.search` (the agent's own
`memory_search`), one memory scope at a time, with the scopes there are to choose from.

Invariants: read only (the vault has one writer, its own worker); one memory scope at a time,
and its search only. The vault's folder is read where it is on this host (the embedded
default: the newest words, a hand edit too); where it is not (a cluster: it lives on the
vault worker's host), the same is read from what every host shares: the cards and today's
entries from the search index, CORE.md from the copy published for the session workers,
and the page says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from psycopg import AsyncConnection

from activities.vault.context import scope_vaults
from activities.vault.files import read_text
from activities.vault.search import search
from activities.vault.store import Vault
from activities.vault_share import shared_vault_text
from activities.workspace import open_store
from schemas.config import KeelSettings
from schemas.vault.card import HISTORY_HEADING, parse_card
from schemas.vault.schema import CORE_FILE, DAILY_DIR
from schemas.vault.scope import DEFAULT_SCOPE, KNOWN_SCOPES_SQL

SEARCH_K = 20


@dataclass
class CardShown:
    path: str
    title: str
    type: str
    status: str
    body: str
    history: list[str]


@dataclass
class VaultView:
    exists: bool
    root: str
    scope: str = DEFAULT_SCOPE
    scopes: list[str] = field(default_factory=list)  # every scope there is, to choose from
    from_index: bool = False  # read from the index and the published copies
    core: str = ""
    cards: dict[str, list[CardShown]] = field(default_factory=dict)
    today: str = ""
    transcript: str = ""
    hits: list[Any] = field(default_factory=list)
    spelling: str = ""  # which words the search took as misspelt, and searched as what


def _read(vault: Vault) -> VaultView:
    root = vault.root
    view = VaultView(exists=root.is_dir(), root=str(root))
    if not view.exists:
        return view
    core = root / CORE_FILE
    view.core = read_text(core).text if core.exists() else ""
    for rel in vault.card_files():
        card = parse_card(read_text(vault.path(rel)).text)
        kind = str(card.meta.get("type")
                   or (rel.split("/")[1] if rel.count("/") >= 2 else "card"))
        history = [ln.strip().removeprefix("- ") for ln in (card.section(HISTORY_HEADING) or [])
                   if ln.strip()]
        body = "\n".join(ln for h, lines in card.sections if h != HISTORY_HEADING
                         for ln in [h, *lines])
        view.cards.setdefault(kind, []).append(CardShown(
            path=rel, title=card.title or rel, type=kind,
            status=str(card.meta.get("status") or ""), body=body.strip(), history=history))
    view.today = vault.local_date(datetime.now(UTC))
    daily = root / DAILY_DIR / f"{view.today}.md"
    view.transcript = read_text(daily).text if daily.exists() else ""
    return view


def hit_link(path: str) -> str | None:
    """A daily-transcript hit (`daily/<day>.md#<session>:<seq>`) links to its message."""
    _, sep, anchor = path.partition("#")
    session_id, colon, seq = anchor.rpartition(":")
    if not (sep and colon and session_id and seq.isdecimal()):
        return None
    return f"/sessions/{quote(session_id, safe='')}?from={seq}#m{seq}"


async def vault_view(settings: KeelSettings,
                     connect: Callable[[], AbstractAsyncContextManager[AsyncConnection]],
                     query: str = "", scope: str = DEFAULT_SCOPE) -> VaultView:
    """One memory scope's vault (the default scope's unless asked), and its search only
    (through `connect`, a connection of the record's pool)."""
    vault = Vault(settings.memory.vault_dir_for(scope), settings.memory, scope=scope)
    view = await asyncio.to_thread(_read, vault)
    async with connect() as conn:
        if not view.exists:  # not on this host
            view = await _indexed(conn, vault, settings)
        view.scope = scope
        view.scopes = sorted({*scope_vaults(settings.memory), *await _known_scopes(conn)})
        if query:
            hits = await search(conn, query, scope=scope, k=SEARCH_K)
            view.hits, view.spelling = list(hits), hits.spelling_note()
    return view


async def _known_scopes(conn: AsyncConnection) -> list[str]:
    rows = await (await conn.execute(KNOWN_SCOPES_SQL)).fetchall()
    return [scope for (scope,) in rows]


async def _indexed(conn: AsyncConnection, vault: Vault, settings: KeelSettings) -> VaultView:
    """The view from what every host shares: the index's cards and today's entries, and
    CORE.md as published for the session workers (activities.vault_share)."""
    view = VaultView(exists=False, root=str(vault.root), from_index=True)
    cards = await (await conn.execute(
        "SELECT path, title, coalesce(card_type, ''), coalesce(status, ''), body FROM"
        " memory_docs WHERE scope = %s AND kind = 'card' ORDER BY path",
        (vault.scope,))).fetchall()
    for path, title, card_type, status, body in cards:
        kind = card_type or (path.split("/")[1] if path.count("/") >= 2 else "card")
        text, history = _split_history(body)
        view.cards.setdefault(kind, []).append(CardShown(
            path=path, title=title or path, type=kind, status=status, body=text,
            history=history))
    view.today = vault.local_date(datetime.now(UTC))
    entries = await (await conn.execute(
        "SELECT body FROM memory_docs WHERE scope = %s AND kind = 'daily' AND"
        " starts_with(path, %s) ORDER BY indexed_at, session_id, seq",
        (vault.scope, f"{DAILY_DIR}/{view.today}.md#"))).fetchall()
    view.transcript = "\n\n".join(body.strip() for (body,) in entries)
    store = open_store(settings, pooled=False)
    view.core = await shared_vault_text(store, vault.scope, CORE_FILE) or ""
    view.exists = bool(cards or entries or view.core) or bool(await (await conn.execute(
        "SELECT 1 FROM memory_docs WHERE scope = %s LIMIT 1", (vault.scope,))).fetchone())
    return view


def _split_history(body: str) -> tuple[str, list[str]]:
    """A card's indexed text and its History's entries, apart (as `_read` shows them)."""
    lines = body.splitlines()
    if HISTORY_HEADING not in lines:
        return body.strip(), []
    at = lines.index(HISTORY_HEADING)
    end = next((i for i in range(at + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    history = [ln.strip().removeprefix("- ") for ln in lines[at + 1:end] if ln.strip()]
    return "\n".join(lines[:at] + lines[end:]).strip(), history
