"""A long session on a small window with the offline model: real checkpoints end to end."""

from __future__ import annotations

import re
import uuid

import psycopg

from keel.client import session_config
from tests.harness import keel_worker, make_settings
from tests.queue_fixture import FIRST_REQUEST, seed_queue


async def test_offline_session_takes_checkpoints_and_keeps_the_queue(
        client, database_url, tmp_path):
    settings = make_settings(database_url, tmp_path)
    session_id = f"q-{uuid.uuid4().hex[:8]}"
    seed_queue(settings.workspaces_dir / session_id, count=60)
    config = session_config(settings, context_window=8000, max_output_tokens=512)
    replies = []
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(session_id, config=config)
        outcome = await session.ask(FIRST_REQUEST)
        replies.append(outcome.reply_text)
        # A checkpoint over the whole conversation frees more room than one over its
        # earlier half did: 45 turns for two of them.
        for _ in range(44):
            outcome = await session.ask("continue")
            assert outcome.error is None, outcome.error
            replies.append(outcome.reply_text)
        status = await session.status()
        mind, memo, now = await session.mind(), await session.memo(), await session.now()
    assert all(r.startswith("[offline model]") for r in replies)
    # The queue position survives every checkpoint: each turn reviews the next PR, none
    # skipped, none reviewed twice.
    reviewed = [int(re.search(r"Reviewed PR #(\d+)", r).group(1)) for r in replies]
    assert reviewed == list(range(101, 146))
    assert status.checkpoint_count >= 2, status
    # Counted as the API counts, and nothing billed: the offline model has no price.
    assert status.spent.input_tokens > 0 and status.spent.usd == 0
    assert FIRST_REQUEST in memo  # word for word, copied from the record
    assert "continue" not in memo.split("#1:", 1)[1].split("\n\n", 1)[1:]  # not kept
    assert "Please work through the pull-request queue" in mind
    assert "reviewed through PR #1" in now
    with psycopg.connect(database_url) as conn:
        kinds = conn.execute("SELECT kind, fallbacks FROM checkpoints WHERE session_id=%s",
                             (session_id,)).fetchall()
        recap_rows = conn.execute(
            "SELECT count(*) FROM messages WHERE session_id=%s AND type='checkpoint'",
            (session_id,)).fetchone()[0]
    assert [k for k, _ in kinds] == ["model"] * status.checkpoint_count
    assert all(f == [] for _, f in kinds)  # the offline model's checkpoints pass the checks
    assert recap_rows == status.checkpoint_count
