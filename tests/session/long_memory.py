"""A session that writes to its long memory, shared by the bundle, delete and erasure
tests: a model that writes Dana's card on "remember Dana" (`rememberer`, the card at
`CARD_FILE`), and reads of the daily notes its turns are transcribed into (`entries`,
`transcribed`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.checkpoint_model import texts
from tests.fake_anthropic import text_message, tool_use_message

CARD = {"op": "ADD", "type": "contact", "title": "Dana Whitfield", "field": "employer",
        "value": "Dana works at Northwind Traders", "confidence": "EXTRACTED",
        "description": "A contact of the user"}
CARD_FILE = Path("cards") / "contacts" / "Dana Whitfield.md"


def rememberer(body: dict[str, Any]) -> dict[str, Any]:
    """"remember Dana" writes her card; a tool result is acknowledged; else an echo."""
    last = body["messages"][-1]
    if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in last["content"]):
        return text_message("Noted.")
    said = texts(last)[-1]
    if said == "remember Dana":
        return tool_use_message([("write_card", CARD)])
    return text_message(f"ok: {said}")


def entries(vault: Path, session_id: str) -> int:
    """How many entries of the session the vault's daily files hold."""
    return sum(f.read_text().count(f"<!-- keel:{session_id}:")
               for f in (vault / "daily").glob("*.md"))


async def transcribed(vault: Path, session_id: str, seq: int) -> None:
    """Wait for the turn's transcript (appended after the reply) to reach the vault."""
    marker = f"<!-- keel:{session_id}:{seq} -->"
    for _ in range(150):
        if any(marker in f.read_text() for f in (vault / "daily").glob("*.md")):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"seq {seq} was never transcribed")
