"""A message sent from a session's page in the web UI: recorded as the user's (a textarea's
CRLF line ends as the newlines typed), its turn answered; an empty, blank or oversized text
refused with the session's own reason and nothing recorded; a form from another site
refused; an ended session's page offers no box. Before, the UI could approve, fork, stop
and delete, but a person reading a session there could not answer it."""

from __future__ import annotations

import re
import uuid

import httpx2 as httpx
import psycopg

from keel.client import session_config
from keel.ui.server import ui_server
from schemas.session import SessionStatus
from tests.harness import keel_worker, make_settings, until


def _user_rows(database_url: str, sid: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        return [r[0] for r in conn.execute(
            "SELECT content_text FROM messages WHERE session_id = %s AND type = 'user'"
            " ORDER BY seq", (sid,)).fetchall()]


async def test_a_message_sent_from_the_page(client, database_url, tmp_path):
    settings = make_settings(database_url, tmp_path)  # the offline model
    sid = f"ui-send-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as keel:
        handle = await keel.start_session(
            sid, config=session_config(settings, max_message_chars=2_000))
        async with (ui_server(keel, settings, database_url, port=0) as url,
                    httpx.AsyncClient(timeout=20) as http):
            base = url.removesuffix("/sessions")
            page = await http.get(f"{base}/sessions/{sid}")
            assert 'id="send"' in page.text and f'action="/sessions/{sid}/send"' in page.text
            (csrf, *_) = re.findall(r'name="csrf" value="([^"]+)"', page.text)

            async def send(text: str, **extra: str) -> httpx.Response:
                return await http.post(f"{base}/sessions/{sid}/send",
                                       data={"csrf": csrf, "text": text, **extra},
                                       headers={"Origin": base})

            sent = await send("Plan for Friday:\r\n- deploy at 10")
            assert sent.status_code == 303 and sent.headers["location"] == f"/sessions/{sid}"
            async def answered() -> SessionStatus | None:
                status = await handle.status()
                return status if status.turn >= 1 and status.phase.value == "idle" else None
            status = await until(answered)
            for text, said in (("", "empty"), ("   \n ", "empty"),
                               ("x" * 2_001, "2001 characters")):
                refused = await send(text)
                assert refused.status_code == 409 and "Not sent" in refused.text, text
                assert said in refused.text, (text, refused.text[-600:])
            foreign = await http.post(f"{base}/sessions/{sid}/send",
                                      data={"csrf": "guess", "text": "from elsewhere"})
            assert foreign.status_code == 403
            await handle.end()
            ended = await http.get(f"{base}/sessions/{sid}")
            assert 'id="send"' not in ended.text
    assert _user_rows(database_url, sid) == ["Plan for Friday:\n- deploy at 10"]
    assert status.turn == 1 and status.last_error is None
