"""What the branching tests share with the bundle, rewind, delete and UI tests: a model
whose turns write notes.txt (`answer`, set by `settings`) and a session with a checkpoint
among its turns (`checkpointed`); and reads of the record (`db`), of the requests the fake
API kept (`user_request`) and of the workspace (`notes`)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from keel.client import KeelClient, SessionHandle
from schemas.config import WorkspaceStoreKind
from tests.checkpoint_model import CheckpointModel, good_checkpoint, texts
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import make_settings, small_config


def answer(body: dict[str, Any]) -> dict[str, Any]:
    """An ordinary turn: "write X" writes notes.txt with X through the tool, then says so;
    anything else is echoed, so the same request always gets the same reply."""
    last = body["messages"][-1]
    if any(b.get("type") == "tool_result" for b in last["content"]
           if isinstance(b, dict)):
        return text_message("written")
    said = texts(last)[-1]
    if said.startswith("write "):
        return tool_use_message([("write_file", {"path": "notes.txt",
                                                 "content": said[len("write "):]})])
    return text_message(f"ok: {said}")


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = CheckpointModel(good_checkpoint, ordinary=answer)
    base = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    return base.model_copy(update={"workspace_store": WorkspaceStoreKind.POSTGRES})


def db(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, args).fetchall()


def user_request(fake: Any, text: str) -> dict[str, Any]:
    """The ordinary request that first carried `text` as the user's newest words."""
    return next(r for r in fake.requests
                if texts(r["messages"][-1])[-1:] == [text])


async def notes(session: SessionHandle) -> str | None:
    found = await session.read_file("notes.txt")
    return found.data.decode() if found else None


async def checkpointed(keel: KeelClient, fake: Any) -> tuple[SessionHandle, dict[str, int]]:
    """A session: two turns, a checkpoint, two more turns, one more: seqs of note."""
    session = await keel.start_session(
        f"b-{uuid.uuid4().hex[:8]}", config=small_config(keel.settings, memory_scope=None))
    await session.ask("write one")
    await session.ask("second message")
    await session.checkpoint_now()
    after_checkpoint = (await session.status()).last_seq
    await session.ask("third message")
    await session.ask("write two")
    inside = (await session.status()).last_seq
    await session.ask("fifth message")
    await session.put_file("notes.txt", "three")
    return session, {"after_checkpoint": after_checkpoint, "inside": inside}
