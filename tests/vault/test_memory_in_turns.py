"""Long memory in the session's turns: the agent's write_card and memory_search tools,
recall fenced in <memory-context>, an echo of the fence scrubbed from the reply, and a
session's own words found again once a checkpoint moved them out of its window."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from tests.checkpoint_model import CheckpointModel, good_checkpoint, texts
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


async def test_cards_written_by_the_agent_are_recalled_in_a_later_session(
        client, settings, fake_anthropic, database_url, tmp_path):
    fake_anthropic.push(
        tool_use_message([("write_card", {
            "op": "ADD", "type": "contact", "title": "Dana Whitfield", "field": "employer",
            "value": "Dana works at Northwind Traders", "confidence": "EXTRACTED",
            "description": "A contact of the user"})]),
        text_message("Noted Dana's employer."),
        tool_use_message([("write_card", {
            "op": "SUPERSEDE", "type": "contact", "title": "Dana Whitfield",
            "field": "employer", "value": "Dana works at Contoso now",
            "confidence": "EXTRACTED"})]),
        text_message("Updated."),
    )
    async with keel_worker(client, settings) as keel:
        first = await keel.start_session(f"a-{uuid.uuid4().hex[:8]}")
        await first.ask("Dana Whitfield works at Northwind Traders.")
        await first.ask("Dana Whitfield moved: she works at Contoso now.")
        tools = {t["name"]: t for t in fake_anthropic.requests[0]["tools"]}
        assert "contact" in tools["write_card"]["input_schema"]["properties"]["type"]["enum"]
        card = (tmp_path / "vault" / "cards" / "contacts" / "Dana Whitfield.md").read_text()
        assert "Contoso" in card and "## History" in card and "Northwind" in card.split(
            "## History", 1)[1]
        fake_anthropic.push(
            tool_use_message([("memory_search", {"query": "Dana Whitfeild employer"})]),
            text_message("<memory-context>leaked</memory-context>She works at Contoso."),
        )
        second = await keel.start_session(f"b-{uuid.uuid4().hex[:8]}")
        outcome = await second.ask("Where does Dana Whitfield work?")
        await _indexed(database_url, first.session_id, 5)  # "Dana Whitfield moved: ..."
    first_call = fake_anthropic.requests[-2]
    question = first_call["messages"][-1]["content"]
    assert question[-1]["text"] == "Where does Dana Whitfield work?"
    fenced = question[-2]["text"]  # recalled, fenced, just before the newest input
    # The card's own fact (its title chunk found, the facts after it shown), whether or
    # not the first session's transcript was written yet.
    assert fenced.startswith("<memory-context") and "Dana works at Contoso now" in fenced
    last = fake_anthropic.requests[-1]["messages"][-1]["content"]
    assert last[0]["type"] == "tool_result"  # tool results still open their message
    search_result = last[0]["content"]
    assert "Contoso" in search_result
    # The misspelt name was searched as the one memory holds, and the result says so.
    assert search_result.startswith('(searched "whitfield" for "whitfeild"'), search_result
    assert outcome.reply_text == "She works at Contoso."  # the echoed fence is scrubbed
    with psycopg.connect(database_url) as conn:
        day = conn.execute("SELECT count(*) FROM messages WHERE type='assistant'").fetchone()
    assert day[0] >= 5
    transcripts = list((tmp_path / "vault" / "daily").glob("*.md"))
    assert transcripts and "Dana Whitfield moved" in transcripts[0].read_text()


async def _indexed(database_url: str, session_id: str, seq: int) -> None:
    """Wait until the vault worker indexed the session's transcript entry at `seq`."""
    for _ in range(300):
        with psycopg.connect(database_url) as conn:
            if conn.execute("SELECT 1 FROM memory_docs WHERE session_id = %s AND seq = %s",
                            (session_id, seq)).fetchone():
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"entry {seq} of {session_id} was never indexed")


async def test_a_session_finds_its_own_words_a_checkpoint_moved_out(
        client, settings, fake_anthropic, database_url):
    """memory_search leaves out what is in the session's window, and finds the session's
    own earlier reply once a checkpoint moved it out (the mind keeps the gist, the vault
    the words)."""
    results: list[str] = []

    def ordinary(body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]
        said = " ".join(texts(last))
        if any(isinstance(b, dict) and b.get("type") == "tool_result"
               for b in last["content"]):
            results.append(said)
            return text_message("Searched.")
        if "search your memory" in said:
            return tool_use_message([("memory_search", {"query": "launch code word"})])
        if "code word" in said:
            return text_message("The launch code word is PELICAN.")
        return text_message("noted")

    fake_anthropic.responder = CheckpointModel(good_checkpoint, ordinary=ordinary)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"own-{uuid.uuid4().hex[:8]}")
        answered = await session.ask("Tell me the launch code word.")
        await _indexed(database_url, session.session_id, answered.reply_seq)
        await session.ask("Please search your memory for the launch code word.")
        assert len(results) == 1 and "PELICAN" not in results[0]  # in the window: left out
        await session.checkpoint_now()
        assert (await session.state()).window_start_seq > answered.reply_seq
        await session.ask("Please search your memory for the launch code word again.")
    assert len(results) == 2 and "PELICAN" in results[1]
