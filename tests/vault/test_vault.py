"""The vault activities on a real PostgreSQL and a real git repository: cards through the
ledger, the transcript, recall, the memory flush (model faked by the fake Messages API)."""

import os
import subprocess
import time
from datetime import UTC, datetime

import pytest

from activities.vault.cards import VaultActivities, WriteCardInput
from activities.vault.context import read_core_text
from activities.vault.rollup import CommitInput, RollupActivities
from activities.vault.search import search
from activities.vault.turn import (
    FlushInput,
    MemoryActivities,
    RecallInput,
    TranscriptInput,
    catch_up_hand_edits,
)
from schemas.config import ModelSettings
from schemas.vault.card import CardFact, parse_card
from schemas.vault.schema import CardOp
from tests.fake_anthropic import tool_use_message
from tests.vault.support import (
    insert_messages,
    load_corpus,
    make_ctx,
    run_activity,
    vault_ctx,
)
from workers.worker import model_backends


@pytest.fixture
def ctx(tmp_path, database_url):
    return vault_ctx(tmp_path, database_url)

T0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)


def git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                          check=True).stdout


def fact(title="Anna Petrova", **kw):
    return CardFact.model_validate({"op": "ADD", "type": "contact", "title": title,
                                    "value": "x", "confidence": "EXTRACTED", **kw})


def test_vault_is_created_from_the_template_as_its_own_repository(ctx):
    root = ctx.vault.root
    for rel in ("CORE.md", "MOC.md", "schema.json", "cards/decisions", "daily",
                "summaries/yearly", "attachments", ".graph"):
        assert (root / rel).exists(), rel
    assert git(root, "rev-parse", "--show-toplevel").strip() == str(root.resolve())
    assert "initialised" in git(root, "log", "--oneline")
    (root / "CORE.md").write_text("# Core\n\nmine\n")
    (root / "schema.json").unlink()
    notes = ctx.vault.ensure()
    assert (root / "CORE.md").read_text() == "# Core\n\nmine\n"  # never overwritten
    assert notes == ["added missing schema.json"]
    assert read_core_text(ctx.settings) == "# Core\n\nmine"


async def test_write_card_adds_supersedes_and_is_searchable(ctx):
    acts = VaultActivities(ctx)
    first = await run_activity(acts.write_card, WriteCardInput(
        op_id="t:1", today="2026-03-01", fact=fact(field="employer", value="Acme Corp")))
    assert first.op == CardOp.ADD and first.path == "cards/contacts/Anna Petrova.md"
    again = await run_activity(acts.write_card, WriteCardInput(
        op_id="t:1", today="2026-03-01", fact=fact(field="employer", value="Acme Corp")))
    assert again.op == CardOp.ADD  # the same op id: the recorded outcome, nothing rewritten
    second = await run_activity(acts.write_card, WriteCardInput(
        op_id="t:2", today="2026-06-02", fact=fact(field="employer", value="TDI Group")))
    assert second.op == CardOp.SUPERSEDE
    card = parse_card(ctx.vault.path(first.path).read_text())
    assert card.section("## History") == [
        "- 2026-03-01→2026-06-02: employer: Acme Corp (EXTRACTED)"]
    pool = await ctx.pool()
    async with pool.connection() as conn:
        assert (await search(conn, "TDI Group", scope="default"))[0].path == first.path


async def test_a_rollup_that_crashed_half_way_writes_no_card_twice(ctx):
    facts = [("plan:0", fact("Anna", field="city", value="Berlin")),
             ("plan:1", fact("Boris", value="likes chess")),
             ("plan:2", fact("Carl", value="plays piano")),
             ("plan:3", fact("Anna", value="has a dog"))]
    blocker = ctx.vault.path("cards/contacts/Carl.md")
    blocker.mkdir(parents=True)  # the third write fails like a crash would stop it
    pool = await ctx.pool()
    with pytest.raises(IsADirectoryError):
        await ctx.vault.apply_facts(pool, facts, "2026-06-01")
    assert ctx.vault.path("cards/contacts/Boris.md").exists()
    blocker.rmdir()
    out = await ctx.vault.apply_facts(pool, facts, "2026-06-01")
    assert [o.skipped for o in out] == [True, True, False, False]
    assert [o.op for o in out] == [CardOp.ADD] * 4
    # A pending op whose write had landed before the crash: re-applied, nothing doubles.
    async with pool.connection() as conn:
        await conn.execute("UPDATE vault_ops SET state = 'pending' WHERE op_id = 'plan:3'")
    out = await ctx.vault.apply_facts(pool, facts, "2026-06-01")
    assert out[3].op == CardOp.NOOP and not out[3].skipped
    anna = ctx.vault.path("cards/contacts/Anna.md").read_text()
    assert anna.count("Berlin") == 1 and anna.count("has a dog") == 1


async def test_a_card_with_broken_frontmatter_is_reported_and_left_alone(ctx):
    path = ctx.vault.path("cards/contacts/Anna.md")
    broken = "---\ntitle: Anna\nthis line breaks it\n---\n# Anna\n"
    path.write_text(broken)
    out = await ctx.vault.apply_facts(await ctx.pool(), [("b:0", fact("Anna"))], "2026-06-01")
    assert out[0].op == CardOp.NOOP and "broken frontmatter" in out[0].note
    assert "line 3" in out[0].note
    assert path.read_text() == broken


async def test_transcript_appends_word_for_word_once_and_keeps_bad_bytes(ctx, database_url):
    insert_messages(database_url, "s1", [
        (1, "user", "Remember that the wifi password is on the fridge.", T0),
        (2, "assistant", "Noted: the password is on the fridge.", T0),
        (3, "tool_result", "{big json}", T0),
        (4, "user", "Second day", datetime(2026, 6, 2, 0, 0, 1, tzinfo=UTC))])
    acts = MemoryActivities(ctx, model_backends())
    daily = ctx.vault.path("daily/2026-06-01.md")
    daily.write_bytes(b"# 2026-06-01\n\nhand note with a bad byte \xff here\n")
    r1 = await run_activity(acts.append_transcript, TranscriptInput(session_id="s1", seq=1))
    r1b = await run_activity(acts.append_transcript, TranscriptInput(session_id="s1", seq=1))
    r2 = await run_activity(acts.append_transcript, TranscriptInput(session_id="s1", seq=2))
    r3 = await run_activity(acts.append_transcript, TranscriptInput(session_id="s1", seq=3))
    r4 = await run_activity(acts.append_transcript, TranscriptInput(session_id="s1", seq=4))
    assert (r1.appended, r1b.appended, r2.appended, r3.appended) == (True, False, True, False)
    assert r1.path == "daily/2026-06-01.md" and r4.path == "daily/2026-06-02.md"
    raw = daily.read_bytes()
    assert raw.startswith(b"# 2026-06-01\n\nhand note with a bad byte \xff here\n")
    text = raw.decode("utf-8", "replace")
    assert text.count("Remember that the wifi password") == 1
    assert "#### 09:00:00 · assistant · s1" in text and "{big json}" not in text
    # Other sessions recall it; the session that said it does not get its own words back.
    other = await run_activity(acts.recall_memory, RecallInput(session_id="s2",
                                                              query="wifi password"))
    own = await run_activity(acts.recall_memory, RecallInput(session_id="s1",
                                                            query="wifi password"))
    assert other.hits == 2 and other.block.startswith("<memory-context>")
    assert "fridge" in other.block
    assert own.hits == 0 and own.block == ""


async def test_recall_counts_access_for_decay(ctx):
    await load_corpus(ctx)
    acts = MemoryActivities(ctx, model_backends())
    result = await run_activity(acts.recall_memory, RecallInput(session_id="s", query="Atlas",
                                                                k=2))
    assert result.hits == 2 and "Project Atlas" in result.block
    pool = await ctx.pool()
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM memory_docs WHERE access_count = 1")
        assert (await cur.fetchone())[0] == 2


async def test_flush_writes_facts_once_through_the_model(tmp_path, database_url, fake_anthropic):
    c = make_ctx(tmp_path, database_url,
                 ModelSettings(base_url=fake_anthropic.base_url, api_key="test"))
    c.vault.ensure()
    insert_messages(database_url, "s1", [
        (1, "user", "Anna moved to TDI Group last week.", T0),
        (2, "assistant", "Good to know.", T0),
        (3, "user", "We decided to ship on Friday.", T0)])
    fake_anthropic.push(tool_use_message([
        ("write_card", {"op": "ADD", "type": "contact", "title": "Anna", "field": "employer",
                        "value": "TDI Group", "confidence": "EXTRACTED"}),
        ("write_card", {"op": "ADD", "type": "decision", "title": "Ship on Friday",
                        "field": "choice", "value": "ship on Friday",
                        "confidence": "EXTRACTED"}),
        ("write_card", {"op": "ADD", "type": "spaceship", "title": "x", "value": "y",
                        "confidence": "EXTRACTED"}),
    ]))
    acts = MemoryActivities(c, model_backends())
    out = await run_activity(acts.flush_memory, FlushInput(session_id="s1", from_seq=1,
                                                           to_seq=3))
    assert (out.added, out.superseded, out.rejected) == (2, 0, 1)
    request = fake_anthropic.requests[0]
    assert '<keel:rollup kind="flush"' in request["system"]
    assert request["tools"][0]["input_schema"]["properties"]["type"]["enum"] == [
        "contact", "project", "decision", "idea", "note"]
    assert "Anna moved to TDI Group" in request["messages"][0]["content"]
    again = await run_activity(acts.flush_memory, FlushInput(session_id="s1", from_seq=1,
                                                             to_seq=3))
    assert len(fake_anthropic.requests) == 1  # the stored plan, no second model call
    assert (again.added, again.superseded) == (2, 0)
    card = c.vault.path("cards/contacts/Anna.md").read_text()
    assert card.count("TDI Group") == 1


async def test_a_vault_folder_that_is_not_a_repository_is_reported(tmp_path, database_url):
    c = make_ctx(tmp_path, database_url)
    root = c.vault.root
    (root / "cards" / "notes").mkdir(parents=True)
    (root / "cards" / "notes" / "Mine.md").write_text("# Mine\n")
    notes = c.vault.ensure()
    assert not (root / ".git").exists()  # never made a repository behind a person's back
    assert "added missing CORE.md" in notes
    result = await run_activity(RollupActivities(c, model_backends()).commit_vault,
                                CommitInput(message="x"))
    assert result.problem and "is not a git repository" in result.problem
    assert (root / "cards" / "notes" / "Mine.md").read_text() == "# Mine\n"


async def test_hand_edits_are_recalled_once_the_vault_worker_caught_up(ctx):
    """Recall reads only the index (activities.vault.turn): a hand edit is found after the
    vault worker's catch-up, without a full reindex."""
    acts = MemoryActivities(ctx, model_backends())
    assert (await run_activity(acts.recall_memory, RecallInput(session_id="s",
                                                               query="sourdough"))).hits == 0
    ctx.vault.path("cards/notes/Bread.md").write_text(
        "---\ntype: note\n---\n# Bread\n\n- feed the sourdough starter on Fridays\n")
    assert (await run_activity(acts.recall_memory, RecallInput(session_id="s",
                                                               query="sourdough"))).hits == 0
    assert await catch_up_hand_edits(ctx) >= 1
    result = await run_activity(acts.recall_memory, RecallInput(session_id="s",
                                                                query="sourdough"))
    assert result.hits == 1 and "cards/notes/Bread.md" in result.block


async def test_a_failed_push_is_reported_and_the_commit_kept(tmp_path, database_url):
    c = make_ctx(tmp_path, database_url, git_push=True)
    c.vault.ensure()
    git(c.vault.root, "remote", "add", "origin", str(tmp_path / "no-such-remote"))
    c.vault.write("cards/notes/X.md", "# X\n")
    result = await run_activity(RollupActivities(c, model_backends()).commit_vault,
                                CommitInput(message="m"))
    assert result.committed and not result.pushed
    assert result.push_problem and "git push failed" in result.push_problem
    assert "m" in git(c.vault.root, "log", "--oneline", "-1")


async def test_transcript_retry_after_a_crash_before_indexing_appends_nothing(ctx, database_url):
    """The append landed, the index row did not: the retry finds the entry in the file's
    tail (a bounded read, whatever the day's length) and only indexes it."""
    from schemas.vault.rollup import entry_marker

    insert_messages(database_url, "s9", [(1, "user", "Keep the release notes short.", T0)])
    acts = MemoryActivities(ctx, model_backends())
    first = await run_activity(acts.append_transcript, TranscriptInput(session_id="s9", seq=1))
    daily = ctx.vault.path(first.path)
    pool = await ctx.pool()
    async with pool.connection() as conn:
        await conn.execute("DELETE FROM memory_docs WHERE session_id = 's9'")
    again = await run_activity(acts.append_transcript, TranscriptInput(session_id="s9", seq=1))
    assert again.appended is False
    assert daily.read_text().count(entry_marker("s9", 1)) == 1
    async with pool.connection() as conn:
        rows = await (await conn.execute(
            "SELECT count(*) FROM memory_docs WHERE session_id = 's9'")).fetchone()
    assert rows == (1,)


async def test_the_vault_lock_waits_for_another_holder(tmp_path) -> None:
    """Free, it is taken at once; held by another writer (another worker: its own open
    file), the next writer waits off the event loop until it is let go."""
    import asyncio
    import fcntl
    import os

    from activities.vault.store import Vault
    from schemas.vault.schema import LOCK_FILE
    from schemas.vault.settings import MemorySettings

    vault = Vault(root=tmp_path / "vault", settings=MemorySettings(vault_dir=tmp_path / "vault"))
    async with vault.lock():
        pass  # free: taken and let go
    other = os.open(vault.root / LOCK_FILE, os.O_RDWR)
    fcntl.flock(other, fcntl.LOCK_EX)
    entered = asyncio.Event()

    async def writer() -> None:
        async with vault.lock():
            entered.set()

    task = asyncio.create_task(writer())
    await asyncio.sleep(0.3)
    assert not entered.is_set()  # and the loop ran meanwhile: this sleep ended
    fcntl.flock(other, fcntl.LOCK_UN)
    os.close(other)
    await asyncio.wait_for(task, 5)
    assert entered.is_set()


async def test_a_git_lock_left_by_a_killed_commit_is_cleared_and_the_vault_committed(
        tmp_path, database_url):
    """A vault worker killed mid-commit (or a git Keel stopped at its timeout) leaves
    `.git/index.lock`; git then refuses every later commit ("Unable to create ... File
    exists"), night after night. A lock older than any git step Keel runs is taken for
    stale, removed and said; a fresh one (a person's git at work) is left alone."""
    c = make_ctx(tmp_path, database_url)
    c.vault.ensure()
    lock = c.vault.root / ".git" / "index.lock"
    commit = RollupActivities(c, model_backends()).commit_vault
    c.vault.write("cards/notes/X.md", "# X\n")
    lock.write_text("")
    result = await run_activity(commit, CommitInput(message="while a person commits"))
    assert not result.committed and result.problem and "index.lock" in result.problem
    assert lock.exists()  # fresh: not ours to remove
    stale = time.time() - 3600
    os.utime(lock, (stale, stale))
    result = await run_activity(commit, CommitInput(message="after the kill"))
    assert result.committed and not result.problem, result
    assert not lock.exists()
    assert any("index.lock" in note and "removed" in note for note in result.notes)
    assert "after the kill" in git(c.vault.root, "log", "--oneline", "-1")


async def test_a_half_written_file_a_killed_worker_left_is_never_committed(
        tmp_path, database_url):
    c = make_ctx(tmp_path, database_url)
    c.vault.ensure()
    (c.vault.root / "cards" / "notes" / ".keel-a1b2c3d4.tmp").write_text("# Hal")
    (c.vault.root / ".keel-zzzz9999.tmp").write_text("")
    c.vault.write("cards/notes/Whole.md", "# Whole\n")
    result = await run_activity(RollupActivities(c, model_backends()).commit_vault,
                                CommitInput(message="nightly"))
    assert result.committed, result
    tracked = git(c.vault.root, "ls-files").split()
    assert "cards/notes/Whole.md" in tracked
    assert not [path for path in tracked if path.endswith(".tmp")]
