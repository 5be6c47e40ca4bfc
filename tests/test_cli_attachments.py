"""Files sent with a message from the command line: `keel send --attach` (a local file, put
in the session's workspace first) and `--attach-workspace`, and the chat's /attach; what the
session would refuse is refused before anything is put or sent."""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import pytest
from PIL import Image

from tests.attached import user_files
from tests.command_line import cli_env, keel, keel_chat  # noqa: F401 (a fixture)
from tests.harness import keel_worker, make_settings


@pytest.fixture
def settings(database_url, tmp_path):
    return make_settings(database_url, tmp_path)  # offline model


@pytest.fixture
def env(cli_env):  # noqa: F811
    """The shell's environment, with the worker's own workspace store (a folder)."""
    return {**cli_env, "KEEL_WORKSPACE_STORE": "local"}


def screenshot(path: Path, size: tuple[int, int] = (320, 200)) -> Path:
    buf = io.BytesIO()
    Image.new("RGB", size, (0, 90, 160)).save(buf, "PNG")
    path.write_bytes(buf.getvalue())
    return path


async def test_send_attaches_local_and_workspace_files(
        client, settings, env, database_url, tmp_path):
    sid = f"att-{uuid.uuid4().hex[:8]}"
    shot = screenshot(tmp_path / "shot.png")
    notes = tmp_path / "notes.txt"
    notes.write_text("deploy on Friday\n")
    exe = tmp_path / "tool.exe"
    exe.write_bytes(b"MZ\x90\x00\x03\x00")
    async with keel_worker(client, settings):
        await keel(env, "start", "--id", sid)
        await keel(env, "put", sid, "docs/notes.txt", str(notes))
        out = await keel(env, "send", sid, "what is in these?", "--attach", str(shot),
                         "--attach-workspace", "docs/notes.txt", "--wait")
        assert "offline model" in out
        refused = await keel(env, "send", sid, "and this?", "-a", str(exe), code=1)
        assert "tool.exe: Keel can attach images (PNG, JPEG, GIF, WebP), PDFs and UTF-8 " \
               "text, and this file is none of them; nothing was sent" in refused
        missing = await keel(env, "send", sid, "this?", "--attach-workspace", "no.png",
                             code=1)
        assert "there is no file at no.png in the session's workspace" in missing
        # Files alone are a message; nothing at all is refused, saying so.
        await keel(env, "send", sid, "--attach-workspace", "docs/notes.txt", "--wait")
        nothing = await keel(env, "send", sid, code=1)
        assert "the message is empty" in nothing
        listed = await keel(env, "files", sid)
    assert user_files(database_url, sid) == [("what is in these?", ["shot.png", "notes.txt"]),
                                             ("", ["notes.txt"])]
    assert "attachments/" in listed and "/shot.png" in listed and "tool.exe" not in listed


async def test_the_chat_sends_attached_files_with_the_next_message(
        client, settings, env, database_url, tmp_path):
    sid = f"atc-{uuid.uuid4().hex[:8]}"
    shot = screenshot(tmp_path / "my shot.png")
    wide = screenshot(tmp_path / "wide.png", (8_001, 1))
    async with keel_worker(client, settings):
        chat = keel_chat(env, sid)
        try:
            await chat.expect("you")
            chat.send(f"/attach '{wide}'\r")
            screen = await chat.expect("not attached")
            assert "wide.png is 8001×1 pixels" in screen
            chat.send(f"/attach '{shot}'\r")
            screen = await chat.expect("with your next message: my shot.png")
            chat.send("What do you see?\r")
            screen = await chat.expect("keel: [offline model]", since=len(screen))
            chat.send("And now, without it?\r")
            await chat.expect("keel: [offline model]", since=len(screen))
            chat.send("/quit\r")
            await chat.expect(f"left {sid}")
        finally:
            chat.close()
    assert user_files(database_url, sid) == [("What do you see?", ["my shot.png"]),
                                            ("And now, without it?", [])]


async def test_start_sends_its_first_message_with_files(
        client, settings, env, database_url, tmp_path):
    sid = f"ats-{uuid.uuid4().hex[:8]}"
    shot = screenshot(tmp_path / "shot.png")
    exe = tmp_path / "tool.exe"
    exe.write_bytes(b"MZ\x90\x00")
    async with keel_worker(client, settings):
        refused = await keel(env, "start", "--id", sid, "-m", "look", "-a", str(exe), code=1)
        assert "tool.exe: Keel can attach images" in refused
        assert "files with the first message" in await keel(
            env, "start", "--id", sid, "-a", str(shot), code=2)
        out = await keel(env, "start", sid, "what is on the screen?", "--attach", str(shot))
        assert f"started session {sid}" in out and "message recorded as seq 1" in out
    assert user_files(database_url, sid) == [("what is on the screen?", ["shot.png"])]
