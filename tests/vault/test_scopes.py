"""Memory scopes: two people in one deployment, and nothing of one ever reaches the other.

Real parts: the Temporal dev server, PostgreSQL, the real SDK talking to the fake Messages
API, which records every request body; every one of them is checked. Also: a model naming
another scope's card in a memory tool gets an error result, a run asking for another scope
is refused, and a session can have no long memory at all.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from activities.vault.context import MemoryContext, scope_vaults
from activities.vault_share import publish_vault_files
from keel.client import session_config
from schemas.session import SessionConfig, SessionInput, SessionState
from schemas.tools import MEMORY_TOOLS
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.vault.scope_seeds import seed
from workers.worker import model_backends
from workflows.session import SessionWorkflow


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def vault_text(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(root.rglob("*"))
                     if p.is_file() and ".git" not in p.parts)


def tool_results(request: dict) -> list[dict]:
    content = request["messages"][-1]["content"]
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]


def result_text(block: dict) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return " ".join(c.get("text", "") for c in content)
    return str(content)


async def test_two_scopes_never_see_each_other(client, settings, fake_anthropic, database_url,
                                               tmp_path):
    alice_root = await seed(settings, database_url, "alice")
    bob_root = await seed(settings, database_url, "bob")
    assert alice_root == tmp_path / "vaults" / "alice"
    assert sorted(scope_vaults(settings.memory)) == ["alice", "bob"]
    requests = fake_anthropic.requests
    async with keel_worker(client, settings) as keel:
        # Alice: recall, memory_search and write_card, all in her own memory.
        fake_anthropic.push(
            tool_use_message([("memory_search", {"query": "kettle order ships"})]),
            text_message("Your kettle ships Tuesday."),
            tool_use_message([("write_card", {
                "op": "ADD", "type": "note", "title": "Kettle order",
                "value": "ALICE-NOTE asked again about the kettle order"})]),
            text_message("Noted."))
        alice = await keel.start_session(
            f"alice-{uuid.uuid4().hex[:6]}", session_config(settings, memory_scope="alice"))
        await alice.ask("ALICE-Q1 where is my kettle order, when does it ship?")
        await alice.ask("ALICE-Q2 note that I asked about the kettle order again.")
        n_alice = len(requests)

        # Bob: the same words; then a model that tries to reach Alice's memory.
        fake_anthropic.push(
            tool_use_message([("memory_search", {"query": "kettle order ships"})]),
            text_message("Your kettle ships Friday."),
            tool_use_message([
                ("write_card", {"op": "ADD", "type": "note",
                                "title": "../alice/cards/notes/Kettle order",
                                "value": "overwrite"}),
                ("write_card", {"op": "ADD", "type": "note", "title": "Kettle order",
                                "value": "x", "scope": "alice"}),
                ("memory_search", {"query": "kettle", "scope": "alice"}),
                ("memory_search", {"query": "alice:cards/notes/Kettle order.md"}),
                ("memory_search", {"query": "kettle", "path": "vaults/alice/CORE.md"}),
            ]),
            text_message("I cannot reach anyone else's memory."))
        bob = await keel.start_session(
            f"bob-{uuid.uuid4().hex[:6]}", session_config(settings, memory_scope="bob"))
        await bob.ask("BOB-Q1 where is my kettle order, when does it ship?")
        await bob.ask("BOB-Q2 read the other customer's kettle order.")
        n_bob = len(requests)

        # A session with no long memory at all.
        fake_anthropic.push(text_message("I keep no memory."))
        none = await keel.start_session(
            f"none-{uuid.uuid4().hex[:6]}", session_config(settings, memory_scope=None))
        await none.ask("NOMEM-Q what do you know about my kettle order?")

    alice_reqs, bob_reqs, none_reqs = (requests[:n_alice], requests[n_alice:n_bob],
                                       requests[n_bob:])
    assert len(alice_reqs) == 4 and len(bob_reqs) == 4 and len(none_reqs) == 1
    for body in alice_reqs:
        text = json.dumps(body, ensure_ascii=False)
        assert "B-2002" not in text and "red kettle" not in text and "BOB-" not in text
    for body in bob_reqs:
        text = json.dumps(body, ensure_ascii=False)
        assert "A-1001" not in text and "blue kettle" not in text and "ALICE-" not in text
    for body in none_reqs:
        text = json.dumps(body, ensure_ascii=False)
        assert "A-1001" not in text and "B-2002" not in text and "kettle;" not in text
        assert "<memory-context" not in text
        assert not {t["name"] for t in body["tools"]} & MEMORY_TOOLS
    # Each scope's own memory did arrive: core memory, recall and search.
    assert "order A-1001" in json.dumps(alice_reqs[0]["system"])  # core memory
    assert "order B-2002" in json.dumps(bob_reqs[0]["system"])
    assert "A-1001" in json.dumps(alice_reqs[0]["messages"])  # recalled
    assert "A-1001" in result_text(tool_results(alice_reqs[1])[0])  # memory_search
    assert "B-2002" in json.dumps(bob_reqs[0]["messages"])
    assert "B-2002" in result_text(tool_results(bob_reqs[1])[0])
    # Every attempt to name Alice's memory from Bob's session was an error result.
    hostile = tool_results(bob_reqs[3])
    assert len(hostile) == 5
    assert all(b.get("is_error") for b in hostile), hostile
    assert all("refused" in result_text(b) for b in hostile)

    # Files: each vault holds its own facts and its own transcript, nothing else.
    alice_files, bob_files = vault_text(alice_root), vault_text(bob_root)
    assert "ALICE-NOTE" in alice_files and "ALICE-Q1" in alice_files
    assert "B-2002" not in alice_files and "BOB-" not in alice_files
    assert "BOB-Q1" in bob_files
    assert "A-1001" not in bob_files and "ALICE-" not in bob_files
    assert "overwrite" not in alice_files + bob_files
    everywhere = vault_text(tmp_path)  # the default scope's folder included, if any
    assert "NOMEM-Q" not in everywhere
    assert not (tmp_path / "vault").exists()  # no session here was the default scope's
    # The index: every document is in its own scope's part.
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT scope, body FROM memory_docs").fetchall()
        scopes = conn.execute(
            "SELECT memory_scope FROM sessions ORDER BY session_id").fetchall()
    assert {s for s, _ in rows} == {"alice", "bob"}
    assert not [b for s, b in rows if s == "bob" and ("A-1001" in b or "ALICE-" in b)]
    assert not [b for s, b in rows if s == "alice" and ("B-2002" in b or "BOB-" in b)]
    assert sorted(scopes, key=str) == [("alice",), ("bob",), (None,)]


async def test_a_run_asking_for_another_scope_is_refused(client, settings):
    sid = f"fixed-{uuid.uuid4().hex[:6]}"
    carried = SessionState(session_id=sid, config=SessionConfig(memory_scope="alice"))
    async with keel_worker(client, settings):
        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(
                SessionWorkflow.run,
                SessionInput(session_id=sid, config=SessionConfig(memory_scope="bob"),
                             state=carried),
                id=sid, task_queue=settings.task_queue)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "MemoryScopeFixed"
    assert "'alice'" in cause.message


async def test_flush_and_every_system_prompt_take_the_sessions_scope(
        settings, fake_anthropic, database_url, tmp_path):
    """The memory flush writes to the session's scope; the system prompt of any step (the
    checkpoint turn loads its window the same way) carries that scope's core memory only."""
    from datetime import UTC, datetime

    from activities.context import SessionContext
    from activities.offline import rollup as offline_rollup
    from activities.vault.turn import FlushInput, MemoryActivities
    from tests.vault.support import insert_messages, run_activity

    alice_root = await seed(settings, database_url, "alice")
    bob_root = await seed(settings, database_url, "bob")
    alice_before = vault_text(alice_root)
    fake_anthropic.responder = offline_rollup.respond
    at = datetime(2026, 6, 2, 9, tzinfo=UTC)
    insert_messages(database_url, "bob-s", [
        (1, "user", "Dana Whitfield works at Northwind Traders. BOB-FLUSH", at),
        (2, "assistant", "Noted.", at)])
    ctx = MemoryContext(settings=settings, database_url=database_url)
    flushed = await run_activity(MemoryActivities(ctx, model_backends()).flush_memory,
                                 FlushInput(session_id="bob-s", from_seq=1, to_seq=2,
                                            scope="bob"))
    assert flushed.added >= 1
    assert "Northwind" in vault_text(bob_root)
    assert vault_text(alice_root) == alice_before  # not a byte of Alice's vault changed
    assert not (tmp_path / "vault").exists()
    assert all("A-1001" not in json.dumps(r) for r in fake_anthropic.requests)

    session = SessionContext(settings, model=model_backends())
    # Session workers read each scope's CORE.md as the vault worker publishes it.
    published = await publish_vault_files(settings, session.store)
    assert {"alice/CORE.md", "bob/CORE.md"} <= set(published)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO sessions (session_id, memory_scope) VALUES"
                     " ('alice-s', 'alice'), ('none-s', NULL)")
        # A new row knows no scope (no core memory) until the model call mirrors it.
        assert conn.execute("SELECT memory_scope FROM sessions WHERE session_id = 'bob-s'"
                            ).fetchone() == (None,)
        conn.execute("UPDATE sessions SET memory_scope = 'bob' WHERE session_id = 'bob-s'")
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        bob_window = await session.windows.load(conn, "bob-s", 1, 2, None)
        alice_window = await session.windows.load(conn, "alice-s", 1, 0, None)
        none_window = await session.windows.load(conn, "none-s", 1, 0, None)
    assert "B-2002" in bob_window.system and "A-1001" not in bob_window.system
    assert "A-1001" in alice_window.system and "B-2002" not in alice_window.system
    assert "A-1001" not in none_window.system and "B-2002" not in none_window.system
    # As the checkpoint estimates:
    assert "A-1001" not in await session.prompt.system_prompt("bob-s")
