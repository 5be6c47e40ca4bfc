"""Which cards a person had a memory scope forget (`keel vault forget`: activities.vault.
forget writes `memory_forgotten`), asked by the cards' paths: what an import with memory
leaves out, where it stages the bundle's cards (activities.bundle) and where the vault
writes them (activities.bundle_memory).

Invariant: a card is keyed as the forgetting keyed it, by its file name
(schemas.vault.card.link_key), whatever folder the path names.
"""

from __future__ import annotations

from psycopg import AsyncConnection

from schemas.vault.card import link_key

__all__ = ["forgotten_paths"]


async def forgotten_paths(conn: AsyncConnection, scope: str, paths: list[str]) -> list[str]:
    """The paths among `paths` (cards') whose card `scope` forgot, sorted."""
    if not paths:
        return []
    keys = {link_key(p): p for p in paths}
    rows = await (await conn.execute(
        "SELECT card_key FROM memory_forgotten WHERE scope = %s AND card_key = ANY(%s)",
        (scope, sorted(keys)))).fetchall()
    return sorted(keys[key] for (key,) in rows)
