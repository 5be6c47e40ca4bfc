"""Long memory in the session's turns: the agent's write_card and memory_search tools,
recall fenced in <memory-context>, and an echo of the fence scrubbed from the reply."""

from __future__ import annotations

import uuid

import psycopg
import pytest

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
            tool_use_message([("memory_search", {"query": "Dana employer"})]),
            text_message("<memory-context>leaked</memory-context>She works at Contoso."),
        )
        second = await keel.start_session(f"b-{uuid.uuid4().hex[:8]}")
        outcome = await second.ask("Where does Dana Whitfield work?")
    first_call = fake_anthropic.requests[-2]
    question = first_call["messages"][-1]["content"]
    assert question[-1]["text"] == "Where does Dana Whitfield work?"
    fenced = question[-2]["text"]  # recalled, fenced, just before the newest input
    assert fenced.startswith("<memory-context") and "Contoso" in fenced
    last = fake_anthropic.requests[-1]["messages"][-1]["content"]
    assert last[0]["type"] == "tool_result"  # tool results still open their message
    search_result = last[0]["content"]
    assert "Contoso" in search_result
    assert outcome.reply_text == "She works at Contoso."  # the echoed fence is scrubbed
    with psycopg.connect(database_url) as conn:
        day = conn.execute("SELECT count(*) FROM messages WHERE type='assistant'").fetchone()
    assert day[0] >= 5
    transcripts = list((tmp_path / "vault" / "daily").glob("*.md"))
    assert transcripts and "Dana Whitfield moved" in transcripts[0].read_text()
