"""Deleting a session from the web UI over HTTP: the session page links to a page that
asks once more, its form deletes the session (a running one only when asked to stop it
first) and says what went and what stayed; the session is then unknown to every page
(real Temporal, PostgreSQL, the fake API)."""

from __future__ import annotations

import re
import uuid

import httpx2 as httpx

from keel.ui.server import ui_server
from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings
from tests.session.deletion import left_behind, temporal_forgot


async def test_a_session_deleted_from_its_page(client, database_url, fake_anthropic,
                                               tmp_path):
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    fake_anthropic.responder = lambda body: text_message("noted")
    async with keel_worker(client, settings) as keel:
        sid = f"ui-del-{uuid.uuid4().hex[:8]}"
        await (await keel.start_session(sid)).ask("<b>a message</b>")
        async with (ui_server(keel, settings, database_url, port=0) as url,
                    httpx.AsyncClient(timeout=30) as http):
            base = url.removesuffix("/sessions")
            page = (await http.get(f"{base}/sessions/{sid}")).text
            assert f'href="/sessions/{sid}/delete" id="delete-link"' in page
            asked = await http.get(f"{base}/sessions/{sid}/delete")
            assert asked.status_code == 200 and "cannot be brought back" in asked.text
            (csrf,) = re.findall(r'name="csrf" value="([^"]+)"', asked.text)
            # Without a token (another site's form): refused, nothing deleted.
            foreign = await http.post(f"{base}/sessions/{sid}/delete", data={"force": "on"})
            assert foreign.status_code == 403
            running = await http.post(f"{base}/sessions/{sid}/delete", data={"csrf": csrf},
                                      headers={"Origin": base})
            assert running.status_code == 409 and "is running: end it first" in running.text
            assert left_behind(database_url, sid)  # refused twice: all of it there
            done = await http.post(f"{base}/sessions/{sid}/delete",
                                   data={"csrf": csrf, "force": "on"},
                                   headers={"Origin": base})
            assert done.status_code == 200, done.text
            assert (f"deleted session {sid} (it was running: stopped first): 2 row(s)"
                    in done.text)
            assert "daily-note entries taken out" in done.text
            assert left_behind(database_url, sid) == {}
            assert (await http.get(f"{base}/sessions/{sid}")).status_code == 404
            assert (await http.get(f"{base}/sessions/{sid}/delete")).status_code == 404
            await temporal_forgot(client, sid)
            again = await http.post(f"{base}/sessions/{sid}/delete", data={"csrf": csrf},
                                    headers={"Origin": base})
            assert again.status_code == 409 and f"no session {sid}" in again.text
