"""A turn's memory activities as the session worker and the vault worker run them: recall
reads only the index in PostgreSQL (it runs where no vault is), a turn's transcript is one
activity for all its seqs, and the writers' own appends never make the vault worker's
catch-up read the day's file again (activities.vault.turn)."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime

import pytest

from activities.vault import turn
from activities.vault.turn import (
    MemoryActivities,
    RecallInput,
    TranscriptsInput,
    catch_up_hand_edits,
)
from tests.vault.support import (
    insert_messages,
    load_corpus,
    make_ctx,
    run_activity,
    vault_ctx,
)
from workers.worker import model_backends

T0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)


async def test_recall_reads_the_index_only(tmp_path, database_url):
    indexed = vault_ctx(tmp_path / "vault-worker", database_url)
    await load_corpus(indexed)
    shutil.rmtree(indexed.vault.root)  # a session worker has no vault at all
    session_side = make_ctx(tmp_path / "session-worker", database_url)
    found = await run_activity(MemoryActivities(session_side, model_backends()).recall_memory,
                               RecallInput(session_id="s", query="Atlas", k=2))
    assert found.hits == 2 and "Project Atlas" in found.block
    assert not session_side.vault.root.exists()  # never opened, never made


async def test_a_turns_transcript_is_one_activity_and_a_retry_appends_nothing(
        tmp_path, database_url):
    ctx = vault_ctx(tmp_path, database_url)
    insert_messages(database_url, "s1", [
        (1, "user", "The deploy key lives in the team vault.", T0),
        (2, "tool_result", "{tool output}", T0),
        (3, "assistant", "Noted: the deploy key is in the team vault.", T0)])
    acts = MemoryActivities(ctx, model_backends())
    first = await run_activity(acts.append_transcripts,
                               TranscriptsInput(session_id="s1", seqs=[1, 2, 3]))
    again = await run_activity(acts.append_transcripts,
                               TranscriptsInput(session_id="s1", seqs=[1, 2, 3]))
    assert [r.appended for r in first.results] == [True, False, True]
    assert [r.path for r in first.results] == ["daily/2026-06-01.md", "", "daily/2026-06-01.md"]
    assert not any(r.appended for r in again.results)
    text = ctx.vault.path("daily/2026-06-01.md").read_text()
    assert text.count("The deploy key lives") == 1 and text.count("Noted: the deploy") == 1
    assert "{tool output}" not in text


async def test_own_appends_leave_nothing_for_the_catch_up_and_hand_edits_do(
        tmp_path, database_url):
    ctx = vault_ctx(tmp_path, database_url)
    rel = "daily/2026-06-01.md"
    daily = ctx.vault.path(rel)
    daily.parent.mkdir(parents=True, exist_ok=True)
    daily.write_text("# 2026-06-01\n\nwritten by hand\n")
    await catch_up_hand_edits(ctx)  # the vault worker's first beat: everything seen
    insert_messages(database_url, "s1", [(1, "user", "Water the ficus on Mondays.", T0)])
    acts = MemoryActivities(ctx, model_backends())
    await run_activity(acts.append_transcripts, TranscriptsInput(session_id="s1", seqs=[1]))
    assert ctx.vault._seen[rel] == ctx.vault.file_stamp(rel)  # not due for a re-read
    ctx.vault.path("cards/notes/Jam.md").write_text(
        "---\ntype: note\n---\n# Jam\n\n- the marmalade recipe wants bitter oranges\n")
    assert await catch_up_hand_edits(ctx) == 1
    found = await run_activity(acts.recall_memory,
                               RecallInput(session_id="s2", query="marmalade recipe"))
    assert found.hits >= 1


async def test_an_entry_appended_but_never_indexed_is_not_appended_again(
        tmp_path, database_url, monkeypatch):
    """The index failed after the append (the database gone for a moment): the next write,
    a batch of two turns, finds the first in the file's tail, indexes it, and appends only
    the second."""
    ctx = vault_ctx(tmp_path, database_url)
    insert_messages(database_url, "s1", [(1, "user", "First words.", T0),
                                         (2, "user", "Second words.", T0),
                                         (3, "user", "Third words.", T0)])
    acts = MemoryActivities(ctx, model_backends())
    await acts.append_transcripts(TranscriptsInput(session_id="s1", seqs=[1]))
    index = turn.index_documents

    async def fails(*args, **kwargs):
        raise OSError("the database went away")
    monkeypatch.setattr(turn, "index_documents", fails)
    with pytest.raises(OSError):
        await acts.append_transcripts(TranscriptsInput(session_id="s1", seqs=[2]))
    monkeypatch.setattr(turn, "index_documents", index)
    again = await acts.append_queued("default", [
        TranscriptsInput(session_id="s1", seqs=[2]), TranscriptsInput(session_id="s1", seqs=[3])])
    assert [r.appended for done in again for r in done.results] == [False, True]
    text = ctx.vault.path("daily/2026-06-01.md").read_text()
    assert [text.count(w) for w in ("First words.", "Second words.", "Third words.")] == [1, 1, 1]
    found = await acts.recall_memory(RecallInput(session_id="s2", query="Second words"))
    assert "daily/2026-06-01.md#s1:2" in found.sources  # indexed by the write after
