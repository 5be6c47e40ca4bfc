"""Vaults of scopes "alice" and "bob", each with a CORE.md line and a card holding its own
order in wording that overlaps the other's (`seed`), for the tests that check a scope sees
only its own memory and the vault commands' tests."""

from __future__ import annotations

from pathlib import Path

from activities.vault.context import MemoryContext
from schemas.vault.card import CardFact
from schemas.vault.schema import CardOp

# Facts that overlap in wording (kettle, order, ships), told apart by their markers.
FACTS = {
    "alice": ("A-1001", "blue kettle", "Order A-1001: the blue kettle ships on Tuesday"),
    "bob": ("B-2002", "red kettle", "Order B-2002: the red kettle ships on Friday"),
}


async def seed(settings, database_url: str, scope: str) -> Path:
    """A scope's vault with a CORE.md line and a card holding its own order."""
    ctx = MemoryContext(settings=settings, database_url=database_url).scoped(scope)
    ctx.vault.ensure()
    marker, kettle, fact = FACTS[scope]
    ctx.vault.write("CORE.md", f"# Core\n\n## Facts\n- Prefers the {kettle}; order {marker}\n")
    await ctx.vault.apply_facts(await ctx.pool(), [("seed:0", CardFact(
        op=CardOp.ADD, type="note", title="Kettle order", value=fact))], "2026-06-01")
    async with (await ctx.pool()).connection() as conn:
        await ctx.vault.reindex(conn)
    return ctx.vault.root
