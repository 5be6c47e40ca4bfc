"""The vault as the UI shows it: CORE.md, the cards by type with their History, today's
transcript, and a search over `activities.vault.search.search` (the agent's own
`memory_search`).

Invariants: read only (the vault has one writer, its own worker); one memory scope at a time,
and its search only; the database is asked only when there is a query.
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

from activities.vault.files import read_text
from activities.vault.search import search
from activities.vault.store import Vault
from schemas.config import KeelSettings
from schemas.vault.card import HISTORY_HEADING, parse_card
from schemas.vault.schema import CORE_FILE, DAILY_DIR
from schemas.vault.scope import DEFAULT_SCOPE

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
    if not (sep and colon and session_id and seq.isdigit()):
        return None
    return f"/sessions/{quote(session_id, safe='')}?from={seq}#m{seq}"


async def vault_view(settings: KeelSettings,
                     connect: Callable[[], AbstractAsyncContextManager[AsyncConnection]] | None,
                     query: str = "", scope: str = DEFAULT_SCOPE) -> VaultView:
    """One memory scope's vault (the default scope's unless asked), and its search only
    (through `connect`, a connection of the record's pool)."""
    vault = Vault(settings.memory.vault_dir_for(scope), settings.memory, scope=scope)
    view = await asyncio.to_thread(_read, vault)
    if query and connect is not None:
        async with connect() as conn:
            hits = await search(conn, query, scope=scope, k=SEARCH_K)
            view.hits, view.spelling = list(hits), hits.spelling_note()
    return view
