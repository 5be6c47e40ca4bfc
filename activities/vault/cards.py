"""The vault's own activities: create it from the template, re-index it, write one card.

A card is written only through `Vault.apply_facts`, under the caller's op id, so a retried
write_card never writes twice.

These models travel in Temporal histories: add fields only as optional with defaults.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from pydantic import BaseModel, Field
from temporalio import activity

from activities.vault.context import MemoryContext, scope_vaults
from schemas.vault.card import CardFact
from schemas.vault.nightly import ScopeList
from schemas.vault.schema import CardOp
from schemas.vault.scope import DEFAULT_SCOPE


class InitVaultResult(BaseModel):
    vault_dir: str
    notes: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    indexed: int = 0


class ReindexInput(BaseModel):
    reason: str = ""
    scope: str = DEFAULT_SCOPE


class ListScopesInput(BaseModel):
    pass


class ReindexResult(BaseModel):
    changed: int
    removed: int


class WriteCardInput(BaseModel):
    """The write_card tool as an activity: one fact, under the caller's op id."""

    op_id: str
    fact: CardFact
    today: str | None = None  # YYYY-MM-DD; None: today in the vault's time zone
    scope: str = DEFAULT_SCOPE


class WriteCardResult(BaseModel):
    op: CardOp
    path: str | None = None
    note: str = ""


class VaultActivities:
    def __init__(self, ctx: MemoryContext) -> None:
        self.ctx = ctx

    @activity.defn(name="init_vault")
    async def init_vault(self, inp: ReindexInput) -> InitVaultResult:
        ctx = self.ctx.scoped(inp.scope)
        vault = ctx.vault
        notes = await asyncio.to_thread(vault.ensure)
        _, problems = vault.schema(reload=True)
        git = await vault.git_problem()
        async with ctx.connection() as conn:
            changed, _ = await vault.reindex(conn)
        return InitVaultResult(
            vault_dir=str(vault.root), notes=notes, indexed=changed,
            problems=[f"{p.where}: {p.problem}" for p in problems] + ([git] if git else []))

    @activity.defn(name="reindex_vault")
    async def reindex_vault(self, inp: ReindexInput) -> ReindexResult:
        ctx = self.ctx.scoped(inp.scope)
        async with ctx.connection() as conn:
            changed, removed = await ctx.vault.reindex(conn)
        return ReindexResult(changed=changed, removed=removed)

    @activity.defn(name="write_card")
    async def write_card(self, inp: WriteCardInput) -> WriteCardResult:
        ctx = self.ctx.scoped(inp.scope)
        vault = ctx.vault
        await asyncio.to_thread(vault.ensure)
        today = inp.today or vault.local_date(datetime.now(vault.tz()))
        (out,) = await vault.apply_facts(await ctx.pool(), [(inp.op_id, inp.fact)], today)
        return WriteCardResult(op=out.op, path=out.path, note=out.note)

    @activity.defn(name="list_memory_scopes")
    async def list_memory_scopes(self, _: ListScopesInput) -> ScopeList:
        """Every scope that has a vault folder (the nightly fan-out runs each)."""
        return ScopeList(scopes=list(scope_vaults(self.ctx.memory)))
