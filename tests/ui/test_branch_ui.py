"""The UI's fork and rewind buttons over HTTP: on every record row and every checkpoint; a
fork opens the new session, which links to its origin; a rewind strikes the abandoned rows
through; a refusal is a page saying why."""

from __future__ import annotations

import re

import httpx2 as httpx

from keel.ui.server import ui_server
from tests.harness import keel_worker
from tests.session.branching import checkpointed, settings  # noqa: F401

FORMS = re.compile(r'<form class="branch"[^>]*>.*?name="seq" value="(\d+)"', re.S)


async def test_fork_and_rewind_from_the_pages(client, settings, fake_anthropic,  # noqa: F811
                                              database_url):
    async with keel_worker(client, settings) as keel:
        session, seqs = await checkpointed(keel, fake_anthropic)
        sid = session.session_id
        async with (ui_server(keel, settings, database_url, port=0) as url,
                    httpx.AsyncClient(timeout=30) as http):
            base = url.removesuffix("/sessions")
            page = (await http.get(f"{base}/sessions/{sid}?from=1")).text
            rows = {int(s) for s in re.findall(r'<article class="msg msg-\w+" id="m(\d+)"',
                                               page)}
            assert rows and rows == {int(s) for s in FORMS.findall(page)}
            timeline = (await http.get(f"{base}/sessions/{sid}/checkpoints")).text
            assert 'name="checkpoint" value="1"' in timeline
            (csrf,) = set(re.findall(r'name="csrf" value="([^"]+)"', page))

            def post(**data: object) -> object:
                return http.post(f"{base}/sessions/{sid}/branch",
                                 data={"csrf": csrf, **data}, headers={"Origin": base})

            forked = await post(action="fork", seq=seqs["after_checkpoint"], checkpoint=1)
            assert forked.status_code == 303, forked.text
            fork_page = (await http.get(base + forked.headers["location"])).text
            assert f'forked from <a href="/sessions/{sid}' in fork_page
            assert f"at #{seqs['after_checkpoint']}" in fork_page
            assert f"copied from {sid} #" in fork_page

            refused = await post(action="rewind", seq=2)  # the tool call of "write one"
            assert refused.status_code == 409 and "inside a tool round" in refused.text
            rewound = await post(action="rewind", seq=seqs["inside"])
            assert rewound.status_code == 303, rewound.text
            after = (await http.get(f"{base}/sessions/{sid}?from=1")).text
            struck = re.findall(r'<article class="msg msg-\w+ rewound" id="m(\d+)"', after)
            assert [int(s) for s in struck] == [seqs["inside"] + 1, seqs["inside"] + 2]
            assert (await http.post(f"{base}/sessions/{sid}/branch",
                                    data={"action": "fork", "seq": 1},
                                    headers={"Origin": base})).status_code == 403
