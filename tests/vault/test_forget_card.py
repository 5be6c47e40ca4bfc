"""Forgetting one card (schemas.vault.forget, activities.vault.forget, `keel vault forget`):
its file and index rows go, the scope's other cards stay, what still names it is said, and
the nightly rollup or a memory flush does not write it again out of material of that day or
before, while the agent's own write_card and later material may. Real PostgreSQL, the
vault's worker and the dev server."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import psycopg
import pytest
from typer.testing import CliRunner

from activities.vault.context import MemoryContext
from activities.vault.forget import ForgetCardActivities
from activities.vault.search import search
from keel.cli import app
from schemas.vault.card import CardFact
from schemas.vault.forget import CardForgotten, ForgetCardInput, forgotten_text, refused_by_forget
from schemas.vault.schema import CardOp
from tests.harness import keel_worker, make_settings
from tests.vault.support import insert_messages, run_activity

DANA = CardFact(op=CardOp.ADD, type="contact", title="Dana Whitfield", field="employer",
                value="Dana works at Northwind Traders")
KETTLE = CardFact(op=CardOp.ADD, type="note", title="Kettle order",
                  value="Order A-1001 ships Tuesday; ask Dana Whitfield")


def test_what_a_forgotten_card_refuses():
    assert refused_by_forget("plan:daily:1:0", "2026-06-01", "2026-06-01")
    assert refused_by_forget("flush:s1:3-9:0", "2026-05-30", "2026-06-01")
    assert not refused_by_forget("plan:daily:1:0", "2026-06-02", "2026-06-01")  # later talk
    assert not refused_by_forget("tool:s1:toolu_1", "2026-06-01", "2026-06-01")  # the agent's
    assert not refused_by_forget("plan:daily:1:0", "2026-06-01", None)  # never forgotten
    said = forgotten_text(CardForgotten(scope="default", title="Dana Whitfield",
                                        path="cards/contacts/Dana Whitfield.md",
                                        forgotten_on="2026-06-01", documents=1,
                                        daily_mentions=3, in_core=True))
    assert said[0].startswith("forgot cards/contacts/Dana Whitfield.md in memory scope")
    assert said[1] == ("still naming 'Dana Whitfield': 3 transcript entries, CORE.md (delete "
                       "their sessions, edit those cards and CORE.md, or erase the scope)")
    assert "git history" in said[-1]
    missing = forgotten_text(CardForgotten(scope="default", title="Nobody"))
    assert missing[0].startswith("no card 'Nobody' in memory scope 'default'")


@pytest.fixture
def settings(database_url, tmp_path):
    return make_settings(database_url, tmp_path)


async def test_a_forgotten_card_is_gone_and_old_material_does_not_write_it_again(
        settings, database_url):
    ctx = MemoryContext(settings=settings, database_url=database_url)
    vault = ctx.vault
    vault.ensure()
    vault.write("CORE.md", "# Core\n\n- Dana Whitfield handles the Northwind account\n")
    pool = await ctx.pool()
    await vault.apply_facts(pool, [("seed:0", DANA), ("seed:1", KETTLE)], "2026-06-01")
    insert_messages(database_url, "s1", [
        (1, "user", "Dana Whitfield moved to Northwind", datetime(2026, 6, 1, tzinfo=UTC))])
    async with pool.connection() as conn:
        await vault.reindex(conn)
    from activities.vault.turn import MemoryActivities, TranscriptsInput
    from workers.worker import model_backends

    await run_activity(MemoryActivities(ctx, model_backends()).append_transcripts,
                       TranscriptsInput(session_id="s1", seqs=[1]))
    done = await run_activity(ForgetCardActivities(ctx).forget_memory_card,
                              ForgetCardInput(scope="default", card="dana whitfield"))
    assert done.path == "cards/contacts/Dana Whitfield.md" and done.title == "Dana Whitfield"
    assert (done.documents, done.daily_mentions, done.in_core) == (1, 1, True)
    assert (done.summary_mentions, done.card_mentions) == (0, 1)  # the kettle card
    assert not vault.path(done.path).exists()
    assert vault.path("cards/notes/Kettle order.md").exists()  # the others stay
    async with pool.connection() as conn:
        hits = await search(conn, "Northwind Traders employer", scope="default")
        assert all(h.path != done.path for h in hits)
    # Material of that day or before: the rollup's and a flush's facts are refused.
    today = done.forgotten_on
    out = await vault.apply_facts(pool, [("plan:daily:x:0", DANA),
                                         ("flush:s1:1-1:0", DANA)], today)
    assert [o.op for o in out] == [CardOp.NOOP, CardOp.NOOP]
    assert out[0].note.startswith(f"rejected: 'Dana Whitfield' was forgotten on {today}")
    assert not vault.path(done.path).exists()
    # The agent's own write_card (the person said it again) writes it anew.
    (again,) = await vault.apply_facts(pool, [("tool:s2:toolu_9", DANA)], today)
    assert again.op == CardOp.ADD and vault.path(done.path).exists()
    # Forgotten again; material of a later day writes it.
    await run_activity(ForgetCardActivities(ctx).forget_memory_card,
                       ForgetCardInput(scope="default", card=done.path))
    (later,) = await vault.apply_facts(pool, [("plan:daily:y:0", DANA)], "9999-01-01")
    assert later.op == CardOp.ADD
    nothing = await run_activity(ForgetCardActivities(ctx).forget_memory_card,
                                 ForgetCardInput(scope="default", card="Nobody Atall"))
    assert nothing.path is None and nothing.documents == 0
    climb = await run_activity(ForgetCardActivities(ctx).forget_memory_card,
                               ForgetCardInput(scope="default", card="cards/../CORE.md"))
    assert climb.path is None and vault.path("CORE.md").is_file()  # a card's path only


async def test_keel_vault_forget_runs_through_the_vault_worker(
        client, settings, database_url, tmp_path):
    ctx = MemoryContext(settings=settings, database_url=database_url).scoped("team")
    ctx.vault.ensure()
    await ctx.vault.apply_facts(await ctx.pool(), [("seed:0", DANA)], "2026-06-01")
    env = {"TEMPORAL_ADDRESS": client.service_client.config.target_host,
           "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": settings.task_queue,
           "KEEL_DATA_DIR": str(tmp_path), "ANTHROPIC_API_KEY": "",
           "ANTHROPIC_BASE_URL": "", "COLUMNS": "200"}

    async def keel(*args: str):
        return await asyncio.to_thread(CliRunner().invoke, app, list(args), env=env)

    async with keel_worker(client, settings):
        done = await keel("vault", "forget", "Dana Whitfield", "--scope", "team")
        again = await keel("vault", "forget", "Dana Whitfield", "--scope", "team")
        # A mistyped scope: it wrote a tombstone there, which made the typo a scope (an
        # erasure of it then said "erased").
        typo = await keel("vault", "forget", "Dana Whitfield", "--scope", "taem")
    assert done.exit_code == 0, done.output
    assert "forgot cards/contacts/Dana Whitfield.md in memory scope 'team'" in done.output
    assert not (ctx.vault.root / "cards" / "contacts" / "Dana Whitfield.md").exists()
    assert again.exit_code == 1 and "no card 'Dana Whitfield'" in again.output
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT scope, title FROM memory_forgotten").fetchall()
    assert rows == [("team", "Dana Whitfield")]
    assert typo.exit_code == 1
    assert ("no memory scope 'taem' (the scopes: default, team); a session's first message "
            "creates its scope; nothing was forgotten") in " ".join(typo.output.split())
    assert not (tmp_path / "vaults" / "taem").exists()
    bad = await keel("vault", "forget", "x\ny", "--scope", "team")
    assert bad.exit_code == 1 and "printable" in bad.output
