"""Random Unicode through every input handler of one running session (hypothesis, bounded):
NUL, lone surrogates (as a plain-JSON client can send them), control and format
characters, sizes past the payload limit. Each input is recorded byte for byte (a user's
message), recorded with its unstorable characters replaced and named (a background
input), or refused with a clear reason, within a bound; the session answers afterwards."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue

from keel.client import MessageRejectedError, session_config
from schemas.input_size import input_limits, kept_prefix, over_limits
from schemas.text import PAYLOAD_LIMIT_BYTES, json_size, make_storable, payload_problem
from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings

RECALL_FAILED = "Long memory could not be searched this turn: "

EXAMPLES = 25
BOUND_S = 10.0
SPECIALS = ["\x00", "\ud800", "\udfff", "\ud83d\ude00", "\u200b", "\ufeff", "\u202e", "\x1b",
            "\x7f", "\u0085", "\u2028", "[Harness: Watch w \"x\"] ", "\uff3b", "\t", "\n"]
text_strategy = st.one_of(
    st.lists(st.one_of(st.characters(), st.sampled_from(SPECIALS)), max_size=200).map("".join),
    # Just past the payload limit as the converter measures it (escapes included).
    st.sampled_from(SPECIALS).map(
        lambda c: c * (PAYLOAD_LIMIT_BYTES // (json_size(c) - 2) + 10)),
)
HANDLERS = ["send_message", "watch", "task", "agent_run", "callback"]
FIELDS = {"watch": {"watch_id": "w-1", "name": "n"}, "task": {"task_id": "t-1", "name": "n"},
          "agent_run": {"run_id": "r-1", "from_session": "s"},
          "callback": {"run_id": "r-2", "from_session": "s"}}


def _rows(database_url: str, sid: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT input_id, type, content_text FROM messages"
                            " WHERE session_id=%s ORDER BY seq", (sid,)).fetchall()


async def test_random_text_through_every_handler(client, database_url, fake_anthropic,
                                                 tmp_path) -> None:
    fake_anthropic.responder = lambda body: text_message("ok")
    config = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    loop = asyncio.get_running_loop()
    tried: list[str] = []
    async with keel_worker(client, config) as keel:
        sid = f"prop-{uuid.uuid4().hex[:8]}"
        session = await keel.start_session(sid)
        handle = client.get_workflow_handle(sid)
        session_cfg = session_config(config)
        limits = input_limits(session_cfg.max_message_chars, session_cfg.window().hard_limit)

        async def one(handler: str, text: str, n: int) -> None:
            start = time.monotonic()
            if handler == "send_message":
                try:
                    accepted = await session.send(text, input_id=f"p-{n}")
                except MessageRejectedError as err:
                    assert str(err).strip(), "a refusal must say why"
                else:
                    row = [r for r in _rows(database_url, sid) if r[0] == f"p-{n}"]
                    assert row and row[0][2] == text, "a user's message is kept byte for byte"
                    assert accepted.input_id == f"p-{n}"
            else:
                body = {**FIELDS[handler], "text": text, "input_id": f"p-{n}"}
                # Any str as JSON: escaped where UTF-8 has no form for it (a surrogate).
                ascii_only = any("\ud800" <= c <= "\udfff" for c in text)
                data = json.dumps(body, ensure_ascii=ascii_only).encode()
                notices = sum(1 for r in _rows(database_url, sid) if r[1] == "notice"
                              and not (r[2] or "").startswith(RECALL_FAILED))
                await handle.signal(handler, RawValue(Payload(
                    metadata={"encoding": b"json/plain"}, data=data)))
                while True:
                    rows = _rows(database_url, sid)
                    mine = [r for r in rows if r[0] == f"p-{n}"]
                    if mine:
                        # JSON parsing joins an escaped surrogate pair by itself.
                        kept, replaced = make_storable(json.loads(data)["text"])
                        expected = kept + (f"\n[Keel: {'; '.join(replaced)}]" if replaced
                                           else "")
                        if over_limits(expected, limits):  # cut, kept whole in the workspace
                            assert mine[0][2].startswith(kept_prefix(expected, limits))
                            assert "\n[Keel: input cut at " in mine[0][2]
                        else:
                            assert mine[0][2] == expected
                        break
                    # The new notice, not the newest row: an earlier input's turn may
                    # record its reply after it.
                    # A turn's recall that failed (a search under the suite's load) is
                    # said in a notice of its own, about long memory, not this input.
                    new_notices = [r for r in rows if r[1] == "notice" and not (
                        r[2] or "").startswith(RECALL_FAILED)][notices:]
                    if new_notices:
                        assert payload_problem(text), "only an oversize input becomes a notice"
                        assert "too large" in new_notices[0][2]
                        break
                    assert time.monotonic() - start < BOUND_S, "no answer within the bound"
                    await asyncio.sleep(0.05)
            assert time.monotonic() - start < BOUND_S

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(handler=st.sampled_from(HANDLERS), text=text_strategy)
        def drive(handler: str, text: str) -> None:
            tried.append(handler)
            asyncio.run_coroutine_threadsafe(one(handler, text, len(tried)), loop).result(60)

        await asyncio.to_thread(drive)
        outcome = await asyncio.wait_for(session.ask("a normal message"), 60)
        status = await session.status()
    assert outcome.reply_text == "ok" and outcome.error is None
    assert status.stopped_reason is None
    assert len(tried) == EXAMPLES
