"""`keel put` / `keel files` against the PostgreSQL workspace store: a user seeds a file,
the agent (a worker with the same store) reads it and writes another, the user reads that
back; no workflow call and no local folder involved. `keel send --attach` the same way."""

from __future__ import annotations

import asyncio
import base64
import uuid
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from keel.cli import app
from schemas.config import KeelSettings, WorkspaceStoreKind
from tests.attached import image
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings


def _copy_upper(body: dict) -> dict:
    results = [b for m in body["messages"] if isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result"]
    if not results:
        return tool_use_message([("read_file", {"path": "in/notes.md"})])
    if len(results) == 1:
        text = results[0]["content"]
        text = text if isinstance(text, str) else text[0]["text"]
        return tool_use_message([("write_file", {"path": "out.md", "content": text.upper()})])
    return text_message("copied")


def _cluster(client: Any, database_url: str, fake: Any, tmp_path: Path
             ) -> tuple[KeelSettings, dict[str, str]]:
    """A worker's settings with the PostgreSQL workspace store, and the shell's environment
    that reaches the same stack (its own data folder: nothing may go to a local one)."""
    settings = make_settings(database_url, tmp_path / "worker", fake.base_url)
    settings = settings.model_copy(update={"workspace_store": WorkspaceStoreKind.POSTGRES})
    env = {"TEMPORAL_ADDRESS": client.service_client.config.target_host,
           "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": settings.task_queue,
           "KEEL_DATA_DIR": str(tmp_path / "cli"), "COLUMNS": "200"}
    return settings, env


async def test_put_then_the_agent_then_files(client, database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = _copy_upper
    settings, env = _cluster(client, database_url, fake_anthropic, tmp_path)
    sid = f"files-{uuid.uuid4().hex[:8]}"
    local = tmp_path / "notes.md"
    local.write_text("hello from the user\n")

    def keel(*args: str, code: int = 0) -> str:
        result = CliRunner().invoke(app, list(args), env=env)
        assert result.exit_code == code, (args, result.output, result.exception)
        return result.output

    assert f"put in/notes.md into {sid} (v1)" in await asyncio.to_thread(
        keel, "put", sid, "in/notes.md", str(local))
    async with keel_worker(client, settings) as kc:
        session = await kc.start_session(sid)
        assert (await session.ask("copy it")).reply_text == "copied"
    listing = await asyncio.to_thread(keel, "files", sid)
    assert "v1    in/notes.md" in listing and "v1    out.md" in listing
    assert await asyncio.to_thread(keel, "files", sid, "out.md") == "HELLO FROM THE USER\n"
    missing = await asyncio.to_thread(keel, "files", sid, "nope.md", code=1)
    assert "no file 'nope.md'" in missing
    assert not (tmp_path / "cli" / "workspaces").exists()  # nothing went to a local folder
    refused = await asyncio.to_thread(keel, "put", sid, "../escape.md", str(local), code=1)
    assert "outside the session's workspace" in refused
    # A PATH ending in / is a folder: the file keeps its name there (it became a file
    # named "docs" before).
    assert f"put docs/notes.md into {sid} (v1)" in await asyncio.to_thread(
        keel, "put", sid, "docs/", str(local))
    assert await asyncio.to_thread(keel, "files", sid, "docs/notes.md") == (
        "hello from the user\n")
    # Said where the store keeps it: a Windows separator and a doubled one are one slash.
    assert f"put docs/notes.md into {sid} (v2)" in await asyncio.to_thread(
        keel, "put", sid, "docs\\.\\notes.md", str(local))
    assert f"put docs/notes.md into {sid} (v3)" in await asyncio.to_thread(
        keel, "put", sid, "docs//notes.md", str(local))
    # A file past anything the store takes is refused by its size, not read whole first.
    huge = tmp_path / "huge.bin"
    with huge.open("wb") as f:
        f.truncate(70 * 1024 * 1024)  # sparse: 70 MiB that take no disk
    refused = await asyncio.to_thread(keel, "put", sid, "huge.bin", str(huge), code=1)
    assert "'huge.bin' would be 73,400,320 bytes; the limit is 10,000,000 bytes" in refused


async def test_send_attach_through_the_postgres_store(client, database_url, fake_anthropic,
                                                      tmp_path):
    """`keel send --attach` on a cluster: the file goes into the PostgreSQL store, the worker
    reads it there, and the model gets it as an image block."""
    fake_anthropic.responder = lambda body: text_message("a grey square")
    settings, env = _cluster(client, database_url, fake_anthropic, tmp_path)
    sid = f"attach-{uuid.uuid4().hex[:8]}"
    shot = tmp_path / "shot.png"
    shot.write_bytes(image(50, 40))
    async with keel_worker(client, settings) as kc:
        await kc.start_session(sid)
        result = await asyncio.to_thread(CliRunner().invoke, app, [
            "send", sid, "what is this?", "--attach", str(shot), "--wait"], env=env)
        assert result.exit_code == 0, (result.output, result.exception)
    assert "a grey square" in result.output
    (block,) = [b for m in fake_anthropic.requests[0]["messages"] for b in m["content"]
                if b["type"] == "image"]
    assert base64.b64decode(block["source"]["data"]) == shot.read_bytes()
    assert not (tmp_path / "cli" / "workspaces").exists()
