"""Shared helpers for the long-memory tests (no tests here): a vault on a fresh database,
the built-in search corpus, and record rows."""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from temporalio.testing import ActivityEnvironment

from activities.vault.cards import VaultActivities
from activities.vault.context import MemoryContext
from schemas.config import KeelSettings, ModelSettings
from schemas.vault.settings import MemorySettings

CORPUS = Path(__file__).resolve().parent / "fixtures" / "search_corpus"


def make_ctx(tmp_path: Path, database_url: str, model: ModelSettings | None = None,
             **memory: Any) -> MemoryContext:  # more of MemorySettings' fields
    values: dict[str, Any] = {"timezone": "UTC", "git_push": False, **memory}
    mem = MemorySettings(vault_dir=tmp_path / "vault", **values)
    settings = KeelSettings(data_dir=tmp_path, database_url=database_url,
                            model=model or ModelSettings(), memory=mem)
    return MemoryContext(settings=settings, database_url=database_url)


def vault_ctx(tmp_path: Path, database_url: str) -> MemoryContext:
    """A context whose vault exists (created from the template)."""
    c = make_ctx(tmp_path, database_url)
    c.vault.ensure()
    return c


async def load_corpus(ctx: MemoryContext) -> list[dict]:
    """Copy the built-in corpus into the vault and index it; returns its queries."""
    shutil.copytree(CORPUS / "vault", ctx.vault.root, dirs_exist_ok=True)
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await ctx.vault.reindex(conn)
    return json.loads((CORPUS / "queries.json").read_text())


async def run_activity(fn, arg):
    return await ActivityEnvironment().run(fn, arg)


def insert_messages(database_url: str, session_id: str,
                    rows: list[tuple[int, str, str, datetime]]) -> None:
    """(seq, type, text, created_at) rows in the record, as the session would write them."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO sessions (session_id) VALUES (%s) ON CONFLICT DO NOTHING",
                     (session_id,))
        for seq, kind, text, at in rows:
            conn.execute(
                "INSERT INTO messages (session_id, seq, input_id, type, content_text,"
                " token_count, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (session_id, seq, f"in-{seq}", kind, text, len(text.split()), at))


def vault_activities(ctx: MemoryContext) -> VaultActivities:
    return VaultActivities(ctx)
