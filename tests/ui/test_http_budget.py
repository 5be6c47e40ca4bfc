"""The web UI's budget answer and stop button over HTTP: a session paused on its budget
shows the request with Raise / Refuse, a raise posted from the page lets the turn finish,
and the Stop button stops a streaming reply (real Temporal, PostgreSQL, the fake API)."""

from __future__ import annotations

import asyncio
import re
import uuid

import httpx2 as httpx

from keel.ui.server import ui_server
from schemas.agent import AgentSpec
from schemas.budget import BudgetLimits, BudgetSpec
from schemas.interrupt import INTERRUPTED_MARK
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.session.budgets import BIG_INPUT, WRITE, paused
from tests.session.streams import LONG, streaming


async def test_budget_raised_and_a_turn_stopped_from_the_page(client, database_url,
                                                               fake_anthropic, tmp_path):
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    fake_anthropic.push(tool_use_message([WRITE], input_tokens=BIG_INPUT),
                        text_message("Done after the raise."), text_message(LONG))
    spec = AgentSpec(budget=BudgetSpec(session=BudgetLimits(usd=0.2)))
    async with keel_worker(client, settings) as keel:
        handle = await keel.start_session(f"ui-budget-{uuid.uuid4().hex[:8]}", agent=spec)
        sid = handle.session_id
        accepted = await handle.send("Write the notes.")
        await paused(handle)
        async with (ui_server(keel, settings, database_url, port=0) as url,
                    httpx.AsyncClient(timeout=20) as http):
            base = url.removesuffix("/sessions")
            page = await http.get(f"{base}/sessions/{sid}")
            assert 'id="budget-request"' in page.text and "Budget reached" in page.text
            # $0.3003 spent of $0.20: "as much again" is another $0.20.
            assert "Allow $0.2000 more" in page.text
            assert 'of <b id="budget">$0.2000</b>' in page.text  # the limit in force
            (csrf, *_) = re.findall(r'name="csrf" value="([^"]+)"', page.text)
            (request_id,) = re.findall(r'name="request_id" value="([^"]+)"', page.text)
            # Raise with its field left empty: refused, saying why (it was a $0 raise).
            empty = await http.post(f"{base}/sessions/{sid}/budget",
                                    data={"csrf": csrf, "decision": "raise", "usd": "",
                                          "request_id": request_id},
                                    headers={"Origin": base})
            assert empty.status_code == 409 and "give the dollars" in empty.text
            # A client other than the page may send anything: said in the UI's words, not
            # Python's ("could not convert string to float").
            words = await http.post(f"{base}/sessions/{sid}/budget",
                                    data={"csrf": csrf, "decision": "raise", "usd": "1,000",
                                          "request_id": request_id},
                                    headers={"Origin": base})
            assert words.status_code == 409, words.text
            assert "are a number such as 5 or 2.50, not &#39;1,000&#39;" in words.text
            assert (await handle.status()).budget_request is not None
            raised = await http.post(f"{base}/sessions/{sid}/budget",
                                     data={"csrf": csrf, "decision": "again",
                                           "request_id": request_id},
                                     headers={"Origin": base})
            assert raised.status_code == 303, raised.text
            outcome = await asyncio.wait_for(handle.wait_reply(accepted.seq), 30)
            assert outcome.reply_text == "Done after the raise."
            fake_anthropic.stream_delay_s = 0.05
            long = await handle.send("Now the long one.")
            await streaming(fake_anthropic, nth=1)
            stopped = await http.post(f"{base}/sessions/{sid}/interrupt",
                                      data={"csrf": csrf}, headers={"Origin": base})
            assert stopped.status_code == 303, stopped.text
            outcome = await asyncio.wait_for(handle.wait_reply(long.seq), 30)
            assert outcome.interrupted and outcome.reply_text.endswith(INTERRUPTED_MARK)
            refused = await http.post(f"{base}/sessions/{sid}/budget",
                                      data={"csrf": csrf, "decision": "refuse"},
                                      headers={"Origin": base})
            assert refused.status_code == 409 and "no budget request" in refused.text
