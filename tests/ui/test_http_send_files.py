"""Files sent with a message from a session's page (a multipart form): put in the session's
workspace, the message recorded with them and shown naming them, an image shown and each
file served from the record (sandboxed, by the kind read from its bytes); a file the
session would refuse is refused with its reason, nothing put or recorded."""

from __future__ import annotations

import re
import uuid

import httpx2 as httpx

from keel.ui.server import ui_server
from schemas.session import SessionStatus
from tests.attached import image, user_files
from tests.harness import keel_worker, make_settings, until


async def test_files_sent_from_the_page(client, database_url, tmp_path):
    # The offline model, a local store; files of at most 100 KB.
    settings = make_settings(database_url, tmp_path).model_copy(
        update={"max_file_bytes": 100_000})
    sid = f"ui-files-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as keel:
        handle = await keel.start_session(sid)
        async with (ui_server(keel, settings, database_url, port=0) as url,
                    httpx.AsyncClient(timeout=20) as http):
            base = url.removesuffix("/sessions")
            page = await http.get(f"{base}/sessions/{sid}")
            assert 'enctype="multipart/form-data"' in page.text and 'name="files"' in page.text
            (csrf,) = set(re.findall(r'name="csrf" value="([^"]+)"', page.text))

            async def send(text: str, files: list[tuple[str, bytes]]) -> httpx.Response:
                return await http.post(
                    f"{base}/sessions/{sid}/send", data={"csrf": csrf, "text": text},
                    files=[("files", (name, data)) for name, data in files],
                    headers={"Origin": base})

            refused = await send("run it", [("tool.exe", b"MZ\x90\x00\x03\x00")])
            assert refused.status_code == 409 and "Not sent" in refused.text
            assert "tool.exe: Keel can attach images" in refused.text
            assert not await handle.list_files()
            sent = await send("What is this?", [("red.png", image(64, 48)),
                                                ("notes.md", b"# n\n")])
            assert sent.status_code == 303, sent.text[-400:]

            async def answered() -> SessionStatus | None:
                status = await handle.status()
                return status if status.turn >= 1 and status.phase.value == "idle" else None
            await until(answered)
            shown = await http.get(f"{base}/sessions/{sid}")
            assert "[attached: red.png (image/png, 64×48, " in shown.text
            assert "[attached: notes.md (text/plain, 4 bytes)]" in shown.text
            # Each file is linked, an image shown, from the record's own bytes.
            assert f'<img src="/sessions/{sid}/files/1/0" alt="red.png"' in shown.text
            served = await http.get(f"{base}/sessions/{sid}/files/1/0")
            assert served.status_code == 200 and served.content == image(64, 48)
            assert served.headers["content-type"] == "image/png"
            assert served.headers["content-security-policy"] == "sandbox"
            assert served.headers["x-content-type-options"] == "nosniff"
            text = await http.get(f"{base}/sessions/{sid}/files/1/1")
            assert text.headers["content-type"] == "text/plain; charset=utf-8"
            assert text.text == "# n\n"
            missing = await http.get(f"{base}/sessions/{sid}/files/1/2")
            assert missing.status_code == 404 and "no file 2" in missing.text
            # A number past PostgreSQL's int or bigint is no file either (it was a 500:
            # "operator does not exist: jsonb -> numeric").
            for path in ("1/99999999999999999999", "99999999999999999999/0",
                         f"1/{2**31}", f"{2**63}/0"):
                far = await http.get(f"{base}/sessions/{sid}/files/{path}")
                assert far.status_code == 404 and "has no file" in far.text, path
            # A form larger than a message's files could be is refused by its length.
            most = 20 * settings.max_file_bytes + 2 * 1024 * 1024
            huge = await send("big", [("big.txt", b"x" * (most + 1))])
            assert huge.status_code == 413 and "Not sent" in huge.text
    assert user_files(database_url, sid) == [("What is this?", ["red.png", "notes.md"])]
