"""Cards written by sessions of one memory scope whose provider numbers its tool calls per
reply (every session's first call is `call_0`): each session's card is written, and a
deleted session's ops do not stand in for a new session's under its id (real worker,
PostgreSQL, Temporal, the fake API)."""

from __future__ import annotations

import uuid
from typing import Any

from tests.checkpoint_model import texts
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.session.branching import db


def card(name: str) -> dict[str, Any]:
    return {"op": "ADD", "type": "contact", "title": name, "field": "employer",
            "value": f"{name} works at Northwind Traders", "confidence": "EXTRACTED",
            "description": "A contact of the user"}


def per_reply_ids(body: dict[str, Any]) -> dict[str, Any]:
    """"remember NAME" writes NAME's card under the call id call_0; else an echo."""
    last = body["messages"][-1]
    if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in last["content"]):
        return text_message("Noted.")
    said = texts(last)[-1]
    if said.startswith("remember "):
        reply = tool_use_message([("write_card", card(said[len("remember "):]))])
        reply["content"][0]["id"] = "call_0"
        return reply
    return text_message(f"ok: {said}")


async def test_every_sessions_card_is_written_whatever_its_call_id(
        client, database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = per_reply_ids
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    cards = tmp_path / "vault" / "cards" / "contacts"
    tag = uuid.uuid4().hex[:6]
    async with keel_worker(client, settings) as keel:
        first = await keel.start_session(f"cards-a-{tag}")
        await first.ask("remember Dana")
        second = await keel.start_session(f"cards-b-{tag}")
        outcome = await second.ask("remember Ravi")
        # Before, the second call_0 was taken for the first's op: "written", and not.
        assert (cards / "Dana.md").is_file() and (cards / "Ravi.md").is_file(), outcome
        # Deleted, its ops go with it: a new session under its id writes its own card.
        await first.end()
        await keel.delete_session(first.session_id)
        assert db(database_url, "SELECT count(*) FROM vault_ops WHERE op_id LIKE %s",
                  f"tool:{first.session_id}:%") == [(0,)]
        from tests.session.deletion import temporal_forgot

        await temporal_forgot(client, first.session_id)
        again = await keel.start_session(first.session_id)
        await again.ask("remember Mei")
        assert (cards / "Mei.md").is_file() and (cards / "Dana.md").is_file()
