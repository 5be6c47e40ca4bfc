"""The web UI over HTTP, without a browser: the pages, the live relay, an approval, the
guard, and serving it (`keel ui`, `keel dev`), against a real Temporal dev server,
PostgreSQL and the offline model. (tests/ui/test_ui.py drives the same pages in Chromium.)
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import httpx2 as httpx
import psycopg
import pytest
from rich.console import Console

from keel.client import KeelClient
from keel.demo import drive_session
from keel.ui.app import UiContext, create_app
from keel.ui.security import UnsafeBindError, check_bind
from keel.ui.server import ui_server
from schemas.model import OFFLINE_MODEL_NAME
from tests.harness import database_closed, keel_worker, make_settings, output_until, until
from tests.ui.support import waiting_for_approval

MESSAGE = re.compile(r'<article class="msg msg-(\w+)" id="m(\d+)"')


def _insert_session(conn: psycopg.Connection, session_id: str, messages: int) -> None:
    conn.execute("INSERT INTO sessions (session_id) VALUES (%s)", (session_id,))
    conn.execute(
        "INSERT INTO messages (session_id, seq, input_id, type, content_text, token_count)"
        " SELECT %s, g, 'in-' || g, CASE WHEN g %% 2 = 1 THEN 'user' ELSE 'assistant' END,"
        " 'message number ' || g, 5 FROM generate_series(1, %s) g", (session_id, messages))


async def _live_record(http: httpx.AsyncClient, url: str, seq: int) -> dict:
    """The first `record` event of the live relay that reaches `seq`."""
    async with http.stream("GET", url, timeout=20) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        name = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: ") and name == "record":
                data = json.loads(line.removeprefix("data: "))
                if data["last_seq"] >= seq:
                    return data
    raise AssertionError("the relay ended without the row")


async def test_a_demo_session_over_http(client, database_url, tmp_path):
    settings = make_settings(database_url, tmp_path)
    session_id = f"ui-{uuid.uuid4().hex[:6]}"
    async with keel_worker(client, settings) as keel:
        result = await drive_session(keel, settings, turns=40, session_id=session_id,
                                     out=Console(file=io.StringIO()))
        assert result.checkpoints >= 2, result
        with psycopg.connect(database_url) as conn:
            stored = conn.execute("SELECT checkpoint_id FROM checkpoints WHERE session_id=%s",
                                  (session_id,)).fetchall()
        async with (ui_server(keel, settings, database_url, port=0,
                              temporal_ui="http://127.0.0.1:8233") as url,
                    httpx.AsyncClient(timeout=20) as http):
            base = url.removesuffix("/sessions")
            assert (await http.get(f"{base}/")).headers["location"] == "/sessions"
            listing = (await http.get(url)).text
            assert f'<tr data-session="{session_id}">' in listing
            assert (f"http://127.0.0.1:8233/namespaces/default/workflows/{session_id}"
                    in listing)

            timeline = (await http.get(f"{base}/sessions/{session_id}/checkpoints")).text
            ids = set(re.findall(r'<li class="cp" data-checkpoint="([^"]+)"', timeline))
            assert ids == {r[0] for r in stored}
            second = (await http.get(f"{base}/sessions/{session_id}/checkpoints/2")).text
            assert 'class="d-added' in second

            page = await http.get(f"{base}/sessions/{session_id}")
            assert page.status_code == 200 and "keel_csrf" in page.headers["set-cookie"]
            status = await keel.session(session_id).status()
            assert f'id="gauge-threshold">{status.checkpoint_threshold:,}<' in page.text
            # No API key on the worker: the page says the offline model answered.
            assert f'id="answered-by">{OFFLINE_MODEL_NAME}<' in page.text
            last = max(int(seq) for _, seq in MESSAGE.findall(page.text))
            accepted = await keel.session(session_id).send("Live: what is <b>next</b>?")
            row = await _live_record(
                http, f"{base}/sessions/{session_id}/live?after_seq={last}", accepted.seq)
            assert "Live: what is &lt;b&gt;next&lt;/b&gt;?" in row["html"]
            await keel.session(session_id).wait_reply(accepted.seq)

            own = (await http.get(f"{base}/sessions/{session_id}?user=1")).text
            assert {kind for kind, _ in MESSAGE.findall(own)} == {"user"}
            vault = await http.get(f"{base}/vault?q=queue")
            assert vault.status_code == 200 and "Results for" in vault.text
            # A misspelt search is searched as the word memory holds, and the page says so.
            misspelt = (await http.get(f"{base}/vault?q=qeue")).text
            note = misspelt.split('class="dim spelling">', 1)[1].split("</p>", 1)[0]
            assert note.startswith("(searched &#34;queue&#34; for &#34;qeue&#34;"), note


async def test_an_approval_decided_over_http(client, database_url, tmp_path):
    settings = make_settings(database_url, tmp_path)
    async with waiting_for_approval(client, settings) as w:
        keel, handle, session_id = w.keel, w.handle, w.session_id
        (waiting,) = w.pending
        async with (ui_server(keel, settings, database_url, port=0) as url,
                    httpx.AsyncClient(timeout=20) as http):
            base = url.removesuffix("/sessions")
            fragment = await http.get(f"{base}/sessions/{session_id}/approvals")
            assert f'data-call="{waiting.call_id}"' in fragment.text
            assert f'value="{waiting.input_digest}"' in fragment.text
            (csrf,) = re.findall(r'name="csrf" value="([^"]+)"', fragment.text)
            decided = await http.post(
                f"{base}/sessions/{session_id}/approvals/{waiting.call_id}",
                data={"csrf": csrf, "decision": "approve",
                      "input_digest": waiting.input_digest},
                headers={"Origin": base})
            assert decided.status_code == 303, decided.text
            assert decided.headers["location"] == f"/sessions/{session_id}"
            outcome = await asyncio.wait_for(handle.wait_reply(w.asked_seq), 30)
            assert not outcome.error and outcome.reply_text
            assert not await handle.pending()
            again = await http.post(
                f"{base}/sessions/{session_id}/approvals/{waiting.call_id}",
                data={"csrf": csrf, "decision": "deny"}, headers={"Origin": base})
            assert again.status_code == 409 and "Not decided" in again.text


async def test_a_sub_agent_s_approval_is_decided_on_its_parent_s_page(
        client, database_url, fake_anthropic, tmp_path):
    """The parent's page lists its sub-agent's waiting call (it showed nothing: the
    person saw the parent waiting on its child, and the child's call nowhere), and a
    decision there reaches the child's call, as `keel approve PARENT` does."""
    from tests.session.teams import spec, team, writing_child

    fake_anthropic.responder = team(writing_child())
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(client, settings) as keel:
        parent = await keel.start_session(f"ui-team-{uuid.uuid4().hex[:8]}",
                                          agent=spec(60, child_asks=True))
        accepted = await parent.send("write it")
        [(holder, call)] = await until(parent.tree_pending)
        async with (ui_server(keel, settings, database_url, port=0) as url,
                    httpx.AsyncClient(timeout=20) as http):
            base = url.removesuffix("/sessions")
            page = await http.get(f"{base}/sessions/{parent.session_id}")
            assert f'data-call="{call.call_id}"' in page.text
            assert f'href="/sessions/{holder}"' in page.text and "sub-agent" in page.text
            (csrf, *_) = re.findall(r'name="csrf" value="([^"]+)"', page.text)
            decided = await http.post(
                f"{base}/sessions/{parent.session_id}/approvals/{call.call_id}",
                data={"csrf": csrf, "decision": "approve", "input_digest": call.input_digest},
                headers={"Origin": base})
            assert decided.status_code == 303, decided.text
        outcome = await asyncio.wait_for(parent.wait_reply(accepted.seq), 60)
        await parent.end()
    assert "wrote it" in outcome.reply_text


async def test_a_sub_agent_paused_on_its_budget_shows_on_its_parent_s_page(
        client, database_url, fake_anthropic, tmp_path):
    """The parent's turn waits on a child paused on its budget: the parent's page says so
    and links the child's page, where its form is (it said nothing was waiting)."""
    from schemas.budget import BudgetLimits, BudgetSpec
    from tests.fake_anthropic import tool_use_message
    from tests.session.budgets import BIG_INPUT, WRITE, paused_child
    from tests.session.teams import spec, team

    fake_anthropic.responder = team(lambda body: tool_use_message([WRITE],
                                                                  input_tokens=BIG_INPUT))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    budgeted = spec().model_copy(update={"budget": BudgetSpec(
        session=BudgetLimits(usd=0.2))})
    async with keel_worker(client, settings) as keel:
        parent = await keel.start_session(f"ui-team-b-{uuid.uuid4().hex[:8]}", agent=budgeted)
        await parent.send("find it")
        child = (await paused_child(parent))[0].session_id
        async with (ui_server(keel, settings, database_url, port=0) as url,
                    httpx.AsyncClient(timeout=20) as http):
            base = url.removesuffix("/sessions")
            page = await http.get(f"{base}/sessions/{parent.session_id}")
            child_page = await http.get(f"{base}/sessions/{child}")
        await parent.end()
    assert f'data-budget="{child}"' in page.text and "Nothing is waiting" not in page.text
    assert f'href="/sessions/{child}#budget-request"' in page.text
    assert 'id="budget-again"' in child_page.text


async def test_bad_input_over_http(client, database_url, tmp_path):
    settings = make_settings(database_url, tmp_path)
    with psycopg.connect(database_url, autocommit=True) as conn:
        _insert_session(conn, "fresh", 3)
        conn.execute("UPDATE messages SET content_text = %s WHERE session_id = 'fresh'"
                     " AND seq = 1", ("<script>window.__pwned = 1</script><b>not bold</b>",))
        conn.execute("UPDATE messages SET content_text = %s WHERE session_id = 'fresh'"
                     " AND seq = 3", ("run \u202etxt.exe\u202c \x1b[2J\x1b]52;c;aGk=\x07",))
        _insert_session(conn, "huge", 30_000)
    keel = KeelClient(client, settings.task_queue, settings)
    async with (ui_server(keel, settings, database_url, port=0) as url,
                httpx.AsyncClient(timeout=20) as http):
        base = url.removesuffix("/sessions")
        unknown = await http.get(f"{base}/sessions/no-such-session")
        assert unknown.status_code == 404 and "no session &#39;no-such-session&#39;" in (
            unknown.text)
        # The live stream too (it said ": connected" and nothing more, for ever).
        for path in ("checkpoints", "checkpoints/1", "live"):
            assert (await http.get(f"{base}/sessions/no-such-session/{path}")
                    ).status_code == 404
        # A count that is no whole number was a 500 and a traceback in the log.
        for query in ("after_seq=abc", "after_event=1e99", "after_seq=-1"):
            bad_count = await http.get(f"{base}/sessions/fresh/live?{query}")
            assert bad_count.status_code == 400, query
            assert "whole numbers, 0 or more" in bad_count.text
        # A control character in the id (a NUL was PostgreSQL's error: a 500): no route.
        for bad in ("%00", "a%00b", "a%0Ab", "fresh%00/checkpoints"):
            assert (await http.get(f"{base}/sessions/{bad}")).status_code == 404, bad

        fresh = await http.get(f"{base}/sessions/fresh")
        assert fresh.status_code == 200 and "No checkpoint yet" in fresh.text
        assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;&lt;b&gt;not bold" in fresh.text
        assert "<script>window" not in fresh.text
        # A bidi override or an escape code is shown by its picture, never acted on.
        assert "run &lt;U+202E&gt;txt.exe&lt;U+202C&gt; \u241b[2J\u241b]52;c;aGk=\u2407" in (
            fresh.text)
        assert not any(c in fresh.text for c in "\u202e\u202c\x1b\x07")
        assert (await http.get(f"{base}/sessions/fresh/checkpoints/1")).status_code == 404

        started = time.monotonic()
        huge = (await http.get(f"{base}/sessions/huge")).text
        assert time.monotonic() - started < 3.0
        seqs = [int(seq) for _, seq in MESSAGE.findall(huge)]
        assert len(seqs) == 200 and seqs[-1] == 30_000
        earlier = (await http.get(f"{base}/sessions/huge?from=29601")).text
        assert [int(s) for _, s in MESSAGE.findall(earlier)][-1] == 29_800

        refused = await http.post(f"{base}/sessions/fresh/approvals/x",
                                  data={"decision": "approve"})
        assert refused.status_code == 403
        foreign = await http.post(f"{base}/sessions/fresh/approvals/x",
                                  data={"decision": "approve", "csrf": "guess"},
                                  headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403
        rebound = await http.get(f"{base}/sessions", headers={"Host": "evil.example:80"})
        assert rebound.status_code == 421


async def test_keel_dev_prints_a_ui_url_that_answers(client, database_url, tmp_path):
    """`keel dev` (here on the configured test stack) serves the UI beside the worker and
    prints its URL beside the Temporal UI's; it stops on SIGTERM. (`keel ui` starts the
    same `ui_server`; below, it refuses a non-loopback address without a token.)"""
    env = {**os.environ, "TEMPORAL_ADDRESS": client.service_client.config.target_host,
           "DATABASE_URL": database_url, "KEEL_DATA_DIR": str(tmp_path),
           "KEEL_TASK_QUEUE": f"ui-{uuid.uuid4().hex[:6]}", "ANTHROPIC_API_KEY": "",
           "ANTHROPIC_BASE_URL": "", "COLUMNS": "200"}
    keel_bin = str(Path(sys.executable).parent / "keel")
    proc = subprocess.Popen([keel_bin, "dev", "--ui-port", "0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = await output_until(proc, "worker running", 40)
        found = re.search(r"http://127\.0\.0\.1:\d+/sessions", seen)
        assert found and "Keel UI" in seen, seen
        with urllib.request.urlopen(found[0], timeout=10) as response:
            assert response.status == 200
            assert "Sessions" in response.read().decode()
        proc.send_signal(signal.SIGTERM)
        rest, _ = await asyncio.to_thread(proc.communicate, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, seen + rest


async def test_keel_ui_refuses_another_address_without_a_token(client, database_url,
                                                                tmp_path):
    from typer.testing import CliRunner

    from keel.cli import app

    env = {"TEMPORAL_ADDRESS": client.service_client.config.target_host,
           "DATABASE_URL": database_url, "KEEL_DATA_DIR": str(tmp_path), "KEEL_UI_TOKEN": "",
           "COLUMNS": "200"}
    result = await asyncio.to_thread(CliRunner().invoke, app, ["ui", "--host", "0.0.0.0"],
                                     env=env)
    assert result.exit_code == 1, result.output
    assert "not loopback" in result.output and "KEEL_UI_TOKEN" in result.output


def test_binding_off_loopback_needs_a_token(database_url, tmp_path):
    with pytest.raises(UnsafeBindError):
        check_bind("0.0.0.0", None)
    check_bind("0.0.0.0", "s3cret")
    check_bind("127.0.0.1", None)
    check_bind("::1", None)


async def test_a_token_is_required_when_set(client, database_url, tmp_path):
    from starlette.testclient import TestClient

    settings = make_settings(database_url, tmp_path)
    ctx = UiContext(keel=KeelClient(client, settings.task_queue, settings),
                    database_url=database_url, settings=settings, token="s3cret")
    # A page that asks no database (TestClient runs the app on a loop of its own, which
    # the process's pool must not outlive).
    with TestClient(create_app(ctx), follow_redirects=False) as http:
        assert http.get("/static/style.css").status_code == 401
        first = http.get("/static/style.css?token=s3cret")
        assert first.status_code == 303 and first.headers["location"] == "/static/style.css"
        assert http.get("/static/style.css").status_code == 200  # the cookie carries it now


async def test_postgresql_away_is_a_page_that_says_so(client, database_url, pg_admin_url,
                                                      tmp_path):
    """The record's database closed under a running UI: each page answers 503 within a
    few seconds, in PostgreSQL's words; before, a bare "Internal Server Error" after the
    pool's 30 s. Open again, the page is back."""
    settings = make_settings(database_url, tmp_path)
    with psycopg.connect(database_url, autocommit=True) as conn:
        _insert_session(conn, "fresh", 3)
    keel = KeelClient(client, settings.task_queue, settings)
    async with (ui_server(keel, settings, database_url, port=0) as url,
                httpx.AsyncClient(timeout=40) as http):
        page = f"{url}/fresh"
        assert (await http.get(page)).status_code == 200
        with database_closed(pg_admin_url, database_url):
            for _ in range(2):  # the pool's broken connection, then none to be had
                started = time.monotonic()
                away = await http.get(page)
                assert away.status_code == 503 and time.monotonic() - started < 10
                assert "The record cannot be read now" in away.text
            assert "is not currently accepting connections" in away.text
        assert (await http.get(page)).status_code == 200

