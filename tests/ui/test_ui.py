"""The web UI in a real browser: headless Chromium (the system's package) driven by
playwright, against a real Temporal dev server, PostgreSQL and the offline model.

Screenshots of every page go to a temporary folder whose path the run prints. Without
Chromium these skip; tests/ui/test_http.py checks the same pages over plain HTTP.
"""

from __future__ import annotations

import asyncio
import io
import os
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from rich.console import Console

from keel.demo import drive_session
from keel.ui.server import ui_server
from tests.harness import keel_worker, make_settings
from tests.ui.support import waiting_for_approval

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="needs the system's chromium (apt-get install chromium)")



@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go: $KEEL_UI_SHOTS, else pytest's own temporary folder (which
    keeps the last few runs' and removes older ones; a folder of our own was never removed)."""
    where = Path(os.environ.get("KEEL_UI_SHOTS") or tmp_path_factory.mktemp("ui-shots"))
    print(f"\nUI screenshots: {where}")
    return where


@pytest.fixture(scope="module")
async def browser():
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        await b.close()


async def shot(page, shots: Path, name: str, full_page: bool = True) -> None:
    shots.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(shots / f"{name}.png"), full_page=full_page)


async def test_demo_session_in_the_browser(client, database_url, tmp_path, browser, shots):
    settings = make_settings(database_url, tmp_path)
    session_id = f"ui-{uuid.uuid4().hex[:6]}"
    async with keel_worker(client, settings) as keel:
        result = await drive_session(keel, settings, turns=40, session_id=session_id,
                                     out=Console(file=io.StringIO()))
        assert result.checkpoints >= 2, result
        with psycopg.connect(database_url) as conn:
            stored = conn.execute("SELECT checkpoint_id FROM checkpoints WHERE session_id=%s",
                                  (session_id,)).fetchall()
        async with ui_server(keel, settings, database_url, port=0,
                             temporal_ui="http://127.0.0.1:8233") as url:
            base = url.removesuffix("/sessions")
            page = await browser.new_page(viewport={"width": 1400, "height": 900})

            # The sessions list shows it, with its phase and a link to the Temporal UI.
            await page.goto(url)
            row = page.locator(f"tr[data-session='{session_id}']")
            await row.wait_for()
            assert "idle" in await row.inner_text()
            assert (await row.locator("a", has_text="Temporal UI").get_attribute("href")
                    == f"http://127.0.0.1:8233/namespaces/default/workflows/{session_id}")
            await shot(page, shots, "1-sessions")

            # The timeline lists every checkpoint the record holds.
            await page.goto(f"{base}/sessions/{session_id}/checkpoints")
            assert await page.locator(".timeline .cp").count() == len(stored)
            ids = {await li.get_attribute("data-checkpoint")
                   for li in await page.locator(".timeline .cp").all()}
            assert ids == {r[0] for r in stored}
            await shot(page, shots, "2-checkpoints")

            # A checkpoint's mind diff shows the offline model's edit against the previous.
            await page.goto(f"{base}/sessions/{session_id}/checkpoints/2")
            changed = page.locator("#mind-diff .d-added, #mind-diff .d-removed, "
                                   "#mind-diff .d-status")
            assert await changed.count() >= 1
            with psycopg.connect(database_url) as conn:
                minds = [r[0] for r in conn.execute(
                    "SELECT mind_text FROM checkpoints WHERE session_id=%s"
                    " ORDER BY created_at, record_seq", (session_id,)).fetchall()]
            added = [t.removeprefix("+ ") for t in
                     await page.locator("#mind-diff .d-added").all_inner_texts()]
            assert any(a.strip() and a in minds[1] and a not in minds[0].splitlines()
                       for a in added), added
            await shot(page, shots, "3-checkpoint-mind-diff")

            # A memo entry links to its message in the record.
            link = page.locator("ul.memo li a.seq").first
            seq = int((await link.inner_text()).lstrip("#"))
            entry = await page.locator("ul.memo li").first.inner_text()
            await link.click()
            await page.wait_for_url(f"**#m{seq}")
            message = page.locator(f"#m{seq}")
            assert "user" in await message.locator(".type").inner_text()
            memo_words = entry.split(" ", 1)[1][:40]
            assert memo_words in await message.locator(".text").inner_text()
            await shot(page, shots, "4-memo-link-in-record", full_page=False)

            # The record reads as a conversation: a harness input under its source line
            # (on the page of the record that holds it: how many rows the later turns add
            # depends on whether the watch shared a turn with the next message)...
            with psycopg.connect(database_url) as conn:
                (watch_seq,) = conn.execute(
                    "SELECT seq FROM messages WHERE session_id=%s AND type='harness'"
                    " AND source_line LIKE %s", (session_id, "%ci-main%")).fetchone()
            await page.goto(f"{base}/sessions/{session_id}?from={max(1, watch_seq - 5)}")
            watch = page.locator(".msg-harness .source", has_text='Watch ci-main "CI status"')
            assert await watch.count() == 1
            # ...tool calls folded under the message that made them; the gauge shows the
            # window. A live turn appears without reloading.
            await page.goto(f"{base}/sessions/{session_id}")
            await page.locator("#live-state", has_text="live").wait_for()
            assert await page.locator("details.tool", has_text="read_file").count() >= 1
            status = await keel.session(session_id).status()
            assert (await page.inner_text("#gauge-threshold")
                    == f"{status.checkpoint_threshold:,}")
            shown_before = await page.locator("#record .msg").count()
            handle = keel.session(session_id)
            accepted = await handle.send("Live check: what is next <b>in the queue</b>?")
            live = page.locator(f"#m{accepted.seq}")
            await live.wait_for(timeout=10_000)
            assert "<b>in the queue</b>" in await live.inner_text()  # escaped, not bold
            await handle.wait_reply(accepted.seq)
            await page.locator(f"#m{accepted.seq} ~ .msg-assistant").first.wait_for(
                timeout=10_000)
            assert await page.locator("#record .msg").count() > shown_before
            await shot(page, shots, "5a-session-top", full_page=False)
            await live.scroll_into_view_if_needed()
            await shot(page, shots, "5b-session-live-turn", full_page=False)

            # The user's own words only.
            await page.click("#filter-user")
            types = set(await page.locator("#record .msg .type").all_inner_texts())
            assert types == {"user"}

            # The vault: CORE.md, cards, today's transcript, and a search over it.
            response = await page.goto(f"{base}/vault?q=queue")
            assert response.status == 200
            assert "Results for" in await page.inner_text("main")
            await shot(page, shots, "9-vault")
            await page.close()


async def test_an_approval_clicked_in_the_page_resumes_the_session(client, database_url,
                                                                     tmp_path, browser, shots):
    settings = make_settings(database_url, tmp_path)
    async with waiting_for_approval(client, settings) as w:
        keel, handle, session_id, waiting = w.keel, w.handle, w.session_id, w.pending
        assert waiting, "no call waits for approval"
        async with ui_server(keel, settings, database_url, port=0) as url:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            await page.goto(f"{url.removesuffix('/sessions')}/sessions/{session_id}")
            box = page.locator(f".approval[data-call='{waiting[0].call_id}']")
            await box.wait_for()
            await shot(page, shots, "11-approval-pending", full_page=False)
            await box.locator("button.approve").click()
            await page.wait_for_url(f"**/sessions/{session_id}")
            outcome = await asyncio.wait_for(handle.wait_reply(w.asked_seq), 30)
            assert not outcome.error and outcome.reply_text
            assert not await handle.pending()
            await page.close()


async def test_a_message_typed_in_the_page_is_answered_there(client, database_url, tmp_path,
                                                            browser, shots):
    """The person types in the session's page and sends; the page reloads following the
    session, and the user's words and the reply appear without another reload."""
    settings = make_settings(database_url, tmp_path)
    sid = f"ui-type-{uuid.uuid4().hex[:6]}"
    async with keel_worker(client, settings) as keel:
        await keel.start_session(sid)
        async with ui_server(keel, settings, database_url, port=0) as url:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            await page.goto(f"{url.removesuffix('/sessions')}/sessions/{sid}")
            await page.locator("#live-state", has_text="live").wait_for()
            await page.fill("#send textarea", "Hello from the browser <b>page</b>")
            await page.click("#send button")
            await page.wait_for_url(f"**/sessions/{sid}")
            mine = page.locator(".msg-user .text", has_text="Hello from the browser <b>page</b>")
            await mine.wait_for(timeout=15_000)
            reply = page.locator(".msg-assistant .text", has_text="[offline model]")
            await reply.first.wait_for(timeout=15_000)
            # The header's figures follow rows that arrive live (they stayed the page
            # load's): another message, sent from elsewhere, and its turn's rows (its tool
            # rows folded into the messages shown, counted all the same).
            await page.locator("#record-last-seq", has_text="2").wait_for(timeout=5_000)
            session = keel.session(sid)
            last = (await session.wait_reply((await session.send("And again.")).seq)).reply_seq
            for _ in range(100):
                if await page.inner_text("#record-last-seq") == str(last):
                    break
                await asyncio.sleep(0.1)
            assert await page.inner_text("#record-last-seq") == str(last)
            assert await page.inner_text("#record-shown-to") == str(last)
            assert await page.inner_text("#record-count") == str(last)  # seqs 1 to last
            await shot(page, shots, "12-message-sent-from-the-page", full_page=False)
            await page.close()
        await keel.session(sid).end()


async def test_a_sub_agent_s_approval_appears_on_its_parent_s_open_page(
        client, database_url, fake_anthropic, tmp_path, browser, shots):
    """The parent's page is open when its sub-agent asks: the call appears there without a
    reload (the child's events are on its own stream; the page reads the box again while a
    sub-agent works), and Approve on it lets the parent's turn finish."""
    import threading

    from tests.session.teams import spec, team, writing_child

    go = threading.Event()  # the page is open before the child asks
    fake_anthropic.responder = team(writing_child(lambda: go.wait(30)))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(client, settings) as keel:
        parent = await keel.start_session(f"ui-live-team-{uuid.uuid4().hex[:6]}",
                                          agent=spec(60, child_asks=True))
        accepted = await parent.send("write it")
        async with ui_server(keel, settings, database_url, port=0) as url:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            await page.goto(f"{url.removesuffix('/sessions')}/sessions/{parent.session_id}")
            await page.locator("#live-state", has_text="live").wait_for()
            assert await page.locator("#approvals .approval").count() == 0
            go.set()
            box = page.locator("#approvals .approval", has_text="write_file")
            await box.wait_for(timeout=20_000)
            assert "sub-agent" in await box.inner_text()
            await shot(page, shots, "13-sub-agent-approval-on-the-parent", full_page=False)
            await box.locator("button.approve").click()
            outcome = await asyncio.wait_for(parent.wait_reply(accepted.seq), 30)
            await page.close()
        await parent.end()
    assert "wrote it" in outcome.reply_text


def _insert_session(conn, session_id: str, messages: int, markup: bool = False) -> None:
    conn.execute("INSERT INTO sessions (session_id) VALUES (%s)", (session_id,))
    conn.execute(
        "INSERT INTO messages (session_id, seq, input_id, type, content_text, token_count)"
        " SELECT %s, g, 'in-' || g, CASE WHEN g %% 2 = 1 THEN 'user' ELSE 'assistant' END,"
        " 'message number ' || g, 5 FROM generate_series(1, %s) g", (session_id, messages))
    if markup:
        conn.execute(
            "UPDATE messages SET content_text = %s WHERE session_id = %s AND seq = 1",
            ("<script>window.__pwned = 1</script><img src=x onerror='window.__pwned=2'>"
             "<b>not bold</b>", session_id))


async def test_bad_input(client, database_url, tmp_path, browser, shots):
    settings = make_settings(database_url, tmp_path)
    with psycopg.connect(database_url, autocommit=True) as conn:
        _insert_session(conn, "fresh", 3, markup=True)
        _insert_session(conn, "huge", 30_000)
    from keel.client import KeelClient

    keel = KeelClient(client, settings.task_queue, settings)
    async with ui_server(keel, settings, database_url, port=0) as url:
        base = url.removesuffix("/sessions")
        page = await browser.new_page(viewport={"width": 1400, "height": 900})

        # An unknown session id: a 404 page that says so.
        response = await page.goto(f"{base}/sessions/no-such-session")
        assert response.status == 404
        assert "no session 'no-such-session'" in await page.inner_text("main")
        assert (await page.goto(f"{base}/sessions/no-such-session/checkpoints")).status == 404
        await shot(page, shots, "6-unknown-session")

        # A session with no checkpoint yet, and markup in a message: shown as text.
        response = await page.goto(f"{base}/sessions/fresh")
        assert response.status == 200
        assert "No checkpoint yet" in await page.inner_text("aside")
        text = await page.locator("#m1 .text").inner_text()
        assert "<script>window.__pwned = 1</script>" in text and "<b>not bold</b>" in text
        assert await page.locator("#m1 .text b, #m1 .text img, #m1 script").count() == 0
        assert await page.evaluate("window.__pwned") is None
        await page.goto(f"{base}/sessions/fresh/checkpoints")
        assert "No checkpoint yet" in await page.inner_text("main")
        assert (await page.goto(f"{base}/sessions/fresh/checkpoints/1")).status == 404
        await page.goto(f"{base}/sessions/fresh")
        await shot(page, shots, "7-no-checkpoint-and-markup")

        # A huge record: one page of it, the latest, quickly; earlier pages by link.
        started = time.monotonic()
        await page.goto(f"{base}/sessions/huge")
        took = time.monotonic() - started
        assert await page.locator("#record .msg").count() == 200
        assert await page.locator("#m30000").count() == 1
        assert took < 3.0, took
        # The click returns once the next page starts loading; what it holds is read after
        # it has loaded (read before, the old page's rows were still there: a flaky run).
        async with page.expect_navigation():
            await page.click("text=← earlier")
        assert await page.locator("#m29800").count() == 1
        assert await page.locator("#m30000").count() == 0
        await shot(page, shots, "8-huge-record-paged", full_page=False)

        # A POST from elsewhere is refused: no CSRF token, or a foreign Origin.
        api = page.context.request
        refused = await api.post(f"{base}/sessions/fresh/approvals/x",
                                 form={"decision": "approve"})
        assert refused.status == 403
        foreign = await api.post(f"{base}/sessions/fresh/approvals/x",
                                 form={"decision": "approve", "csrf": "guess"},
                                 headers={"Origin": "http://evil.example"})
        assert foreign.status == 403
        # A Host that is not the loopback one it was bound to (DNS rebinding).
        rebound = await api.get(f"{base}/sessions", headers={"Host": "evil.example:80"})
        assert rebound.status == 421

        # The vault: a card by its type, with its History; markup in it stays text.
        from activities.vault.store import Vault

        vault = Vault(settings.memory.vault_dir, settings.memory)
        vault.ensure()
        card = vault.root / "cards" / "projects" / "billing-api.md"
        card.parent.mkdir(parents=True, exist_ok=True)
        card.write_text("---\ntype: project\nstatus: active\n---\n# Billing API\n\n"
                        "## Facts\n- owner: <i>mara.k</i>\n\n## History\n"
                        "- 2026-11-30: owner was j.okafor\n")
        await page.goto(f"{base}/vault")
        shown = page.locator("details.card", has_text="Billing API")
        await shown.locator("summary").click()
        assert "owner was j.okafor" in await shown.locator(".history").inner_text()
        assert "<i>mara.k</i>" in await shown.inner_text()
        await shot(page, shots, "10-vault-card-history")
        await page.close()
