"""The web UI's vault over HTTP, without a browser: any memory scope shown (from the index
and the published CORE.md where the vault's folder is on another host, as on a cluster),
and a scope erased from the page, asked once more, with its sessions when ticked; a form
from another site refused. Real Temporal, PostgreSQL and the fake API."""

from __future__ import annotations

import re
import uuid

import httpx2 as httpx
import pytest

from keel.ui.server import ui_server
from schemas.config import WorkspaceStoreKind
from tests.harness import keel_worker, make_settings, until
from tests.session.branching import db
from tests.session.long_memory import rememberer
from tests.vault.erasing import remembered, scope_rows


async def test_the_vault_page_shows_a_scope_whose_folder_is_on_another_host(
        client, database_url, fake_anthropic, tmp_path):
    """A cluster's web UI runs where the vault's folder is not: the page shows the scope
    from the index and the published CORE.md, and lists the scopes to choose from."""
    fake_anthropic.responder = rememberer
    shared = {"workspace_store": WorkspaceStoreKind.POSTGRES}  # what a cluster shares
    worker = make_settings(database_url, tmp_path / "worker",
                           fake_anthropic.base_url).model_copy(update=shared)
    here = make_settings(database_url, tmp_path / "ui").model_copy(update=shared)
    scope = f"acme-{uuid.uuid4().hex[:6]}"
    async with keel_worker(client, worker) as keel:
        await remembered(keel, scope, "the harbour code is 4471")
        async with (ui_server(keel, here, database_url, port=0) as url,
                    httpx.AsyncClient(timeout=20) as http):
            base = url.removesuffix("/sessions")

            async def page() -> str | None:  # once the beat has published its CORE.md
                text = (await http.get(f"{base}/vault", params={"scope": scope})).text
                return text if "cards, daily transcripts and summaries" in text else None

            shown = await until(page, within_s=20)
            assert "shown from the search index" in shown
            assert "Dana Whitfield" in shown and "Dana works at Northwind Traders" in shown
            assert "the harbour code is 4471" in shown  # today's transcript
            listing = (await http.get(f"{base}/vault")).text
            assert f'href="/vault?scope={scope}"' in listing
            found = (await http.get(f"{base}/vault", params={"scope": scope,
                                                             "q": "harbour"})).text
            assert "Results for" in found and "4471" in found
            bad = await http.get(f"{base}/vault", params={"scope": "Not A Scope"})
            assert bad.status_code == 400 and "is not a memory scope" in bad.text
            # A mistyped scope was shown as an empty one, and listed among the scopes.
            typo = await http.get(f"{base}/vault", params={"scope": f"x{scope}"})
            assert typo.status_code == 404, typo.text
            assert f"no memory scope &#39;x{scope}&#39; (the scopes: " in typo.text
            assert scope in typo.text
            assert (await http.get(f"{base}/vault")).status_code == 200  # always there


def test_a_card_s_history_is_shown_apart_from_its_indexed_text() -> None:
    from keel.ui.vault import _split_history

    body = "## Facts\n- owner: mara.k\n\n## History\n- 2026-11-30: owner was j.okafor\n" \
           "\n## Links\n- [[billing]]\n"
    text, history = _split_history(body)
    assert history == ["2026-11-30: owner was j.okafor"]
    assert text == "## Facts\n- owner: mara.k\n\n## Links\n- [[billing]]"
    assert _split_history("plain words\n") == ("plain words", [])


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = rememberer
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


async def test_a_scope_is_erased_from_the_vault_page_once_asked_again(
        client, settings, database_url):
    scope = f"ui-erase-{uuid.uuid4().hex[:6]}"
    folder = settings.memory.vault_dir_for(scope)
    async with keel_worker(client, settings) as keel:
        session = await remembered(keel, scope, "the vault page's own words")
        async with (ui_server(keel, settings, database_url, port=0) as url,
                    httpx.AsyncClient(timeout=20) as http):
            base = url.removesuffix("/sessions")
            page = (await http.get(f"{base}/sessions/{session.session_id}")).text
            assert f'id="scope" href="/vault?scope={scope}">{scope}</a>' in page
            vault = (await http.get(f"{base}/vault", params={"scope": scope})).text
            assert f'href="/vault/erase?scope={scope}"' in vault
            asked = (await http.get(f"{base}/vault/erase", params={"scope": scope})).text
            assert f"Erase memory scope {scope}?" in asked and 'id="erase-form"' in asked
            (csrf, *_) = re.findall(r'name="csrf" value="([^"]+)"', asked)

            async def erase(**form: str) -> httpx.Response:
                return await http.post(f"{base}/vault/erase", headers={"Origin": base},
                                       data={"csrf": csrf, "scope": scope, **form})

            foreign = await http.post(f"{base}/vault/erase", headers={"Origin": base},
                                      data={"csrf": "guess", "scope": scope})
            assert foreign.status_code == 403 and folder.is_dir()
            running = await erase()
            assert running.status_code == 409 and "in use by 1 running session" in running.text
            assert folder.is_dir() and scope_rows(database_url, scope)

            done = await erase(with_sessions="on", force="on")
            assert done.status_code == 200, done.text
            assert f"erased memory scope &#39;{scope}&#39;: 1 session(s) deleted first" in done.text
            assert session.session_id in done.text
            assert not folder.exists() and scope_rows(database_url, scope) == {}
            assert db(database_url, "SELECT count(*) FROM sessions WHERE session_id = %s",
                      session.session_id) == [(0,)]
            again = await erase()
            assert again.status_code == 404 and "Nothing to erase" in again.text
            assert "<title>Nothing to erase" in again.text  # not "Erased ..."
            bad = await http.get(f"{base}/vault/erase", params={"scope": "No Scope"})
            assert bad.status_code == 400



async def test_a_card_is_forgotten_from_the_vault_page_once_asked_again(
        client, settings, database_url):
    scope = f"ui-forget-{uuid.uuid4().hex[:6]}"
    card = "cards/contacts/Dana Whitfield.md"
    folder = settings.memory.vault_dir_for(scope)
    async with keel_worker(client, settings) as keel:
        await remembered(keel, scope, "Dana's words stay in the transcript")
        async with (ui_server(keel, settings, database_url, port=0) as url,
                    httpx.AsyncClient(timeout=20) as http):
            base = url.removesuffix("/sessions")
            vault = (await http.get(f"{base}/vault", params={"scope": scope})).text
            link = (f'href="/vault/forget?scope={scope}&amp;card=cards/contacts/'
                    'Dana%20Whitfield.md"')
            assert link in vault
            asked = (await http.get(f"{base}/vault/forget",
                                    params={"scope": scope, "card": card})).text
            assert f"Forget {card}?" in asked and 'id="forget-form"' in asked
            (csrf, *_) = re.findall(r'name="csrf" value="([^"]+)"', asked)
            foreign = await http.post(f"{base}/vault/forget", headers={"Origin": base},
                                      data={"csrf": "guess", "scope": scope, "card": card})
            assert foreign.status_code == 403 and (folder / card).is_file()
            done = await http.post(f"{base}/vault/forget", headers={"Origin": base},
                                   data={"csrf": csrf, "scope": scope, "card": card})
            assert done.status_code == 200, done.text
            assert f"forgot {card} in memory scope &#39;{scope}&#39;" in done.text
            assert not (folder / card).exists()
            again = await http.post(f"{base}/vault/forget", headers={"Origin": base},
                                    data={"csrf": csrf, "scope": scope, "card": card})
            assert again.status_code == 404 and "<h1>Nothing forgotten</h1>" in again.text
            assert f"no card &#39;{card}&#39; in memory scope" in again.text
            assert "<title>Nothing forgotten" in again.text  # not "Forgot ..."
            vault = (await http.get(f"{base}/vault", params={"scope": scope})).text
            assert "Dana Whitfield" not in vault.split("<h2>Cards</h2>")[1].split("<h2>")[0]


def test_a_transcript_hit_links_its_message_by_its_seq_alone() -> None:
    from keel.ui.vault import hit_link

    assert hit_link("daily/2026-06-01.md#s 1:12") == "/sessions/s%201?from=12#m12"
    for path in ("daily/2026-06-01.md#s1:²", "daily/2026-06-01.md#s1:", "cards/x.md"):
        assert hit_link(path) is None, path
