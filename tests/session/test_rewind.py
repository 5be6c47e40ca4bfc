"""What a rewind leaves behind and what comes after it: the abandoned branch's wakeups are
cancelled, a message sent while the rewind runs gets a turn on the rewound context only,
and an input id of a rewound row is free again. Real Temporal (the dev server), real
PostgreSQL, the fake Messages API (which keeps every request)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest
from temporalio.service import RPCError

from keel.record import search_memory
from schemas.agent import AgentSpec
from schemas.initiative import WakeupLimits
from tests.checkpoint_model import texts
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, small_config
from tests.session.branching import db, settings, user_request  # noqa: F401
from tests.session.long_memory import CARD_FILE, entries, rememberer, transcribed

WAKES = AgentSpec(wakeups=WakeupLimits(min_interval_s=1, max_active=5, expiry_s=3600))


def waker(body: dict[str, Any]) -> dict[str, Any]:
    """"wake once" schedules a one-shot, "wake often" a recurring wakeup; a tool result is
    acknowledged; anything else is echoed."""
    last = body["messages"][-1]
    if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in last["content"]):
        return text_message("scheduled")
    said = texts(last)[-1]
    if said == "wake once":
        return tool_use_message([("schedule_wakeup", {"note": "look again",
                                                      "after_s": 600})])
    if said == "wake often":
        return tool_use_message([("schedule_wakeup", {"note": "poll CI", "every_s": 600})])
    return text_message(f"ok: {said}")


async def test_rewind_cancels_the_wakeups_of_the_abandoned_branch(
        client, settings, fake_anthropic, database_url):  # noqa: F811
    fake_anthropic.responder = waker
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(
            f"r-{uuid.uuid4().hex[:8]}", agent=WAKES,
            config=small_config(settings, memory_scope=None))
        await session.ask("wake once")  # #1, the call #2, its result #3, the reply #4
        await session.ask("wake often")  # #5 to #8
        await session.ask("wake once")  # #9 to #12
        made = await session.wakeups()
        assert [(w.id, w.seq) for w in made] == [("w1", 2), ("w2", 6), ("w3", 10)]
        schedule = made[1].schedule_id
        assert schedule is not None
        await client.get_schedule_handle(schedule).describe()  # it exists
        await session.rewind(4)
        assert [w.id for w in await session.wakeups()] == ["w1"]  # scheduled before #4
        with pytest.raises(RPCError):  # the recurring one's schedule is deleted
            await client.get_schedule_handle(schedule).describe()
    notices = db(database_url, "SELECT content_text FROM messages WHERE session_id = %s"
                 " AND type = 'notice' AND rewound_by IS NULL", session.session_id)
    assert any("rewind to #4 cancelled" in t and "w2" in t and "w3" in t
               for (t,) in notices)


async def test_a_message_sent_while_the_rewind_runs_sees_the_rewound_context(
        client, settings, fake_anthropic, database_url):  # noqa: F811
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(
            f"r-{uuid.uuid4().hex[:8]}", config=small_config(settings, memory_scope=None))
        await session.ask("kept words")  # #1, #2
        await session.ask("abandoned words")  # #3, #4
        # Another transaction holds the rewinds' table: the rewind's activity gets as far
        # as its last insert and waits there while the message comes.
        with psycopg.connect(database_url) as holder:
            holder.execute("LOCK TABLE session_rewinds IN EXCLUSIVE MODE")
            rewinding = asyncio.create_task(session.rewind(2))
            await asyncio.sleep(1.5)
            asking = asyncio.create_task(session.ask("concurrent words"))
            await asyncio.sleep(1.5)
            assert not asking.done()  # no turn while the rewind runs
            holder.rollback()
        done = await rewinding
        outcome = await asyncio.wait_for(asking, 30)
    assert (done.first_rewound, done.last_rewound) == (3, 4)
    assert outcome.reply_text == "ok: concurrent words"
    sent = user_request(fake_anthropic, "concurrent words")
    assert "kept words" in str(sent["messages"])
    assert "abandoned words" not in str(sent["messages"])
    live = db(database_url, "SELECT seq, content_text FROM messages WHERE session_id = %s"
              " AND rewound_by IS NULL ORDER BY seq", session.session_id)
    assert [t for _, t in live][-2:] == ["concurrent words", "ok: concurrent words"]


async def test_an_input_id_of_a_rewound_row_is_a_new_input(
        client, settings, fake_anthropic, database_url):  # noqa: F811
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(
            f"r-{uuid.uuid4().hex[:8]}", config=small_config(settings, memory_scope=None))
        await session.ask("first")  # #1, #2
        first = await session.send("second words", input_id="msg-2")  # #3, #4
        await session.wait_reply(first.seq)
        await session.rewind(2)
        again = await session.send("second words, again", input_id="msg-2")
        assert again.seq > first.seq  # a new input, not the rewound one
        outcome = await session.wait_reply(again.seq)
        assert outcome.reply_text == "ok: second words, again"
        retried = await session.send("second words, again", input_id="msg-2")
        assert retried.seq == again.seq  # still one live input per id
    rows = db(database_url, "SELECT seq, rewound_by IS NOT NULL FROM messages"
              " WHERE session_id = %s AND input_id = 'msg-2' ORDER BY seq",
              session.session_id)
    assert rows == [(first.seq, True), (again.seq, False)]


async def test_what_the_rewound_rows_said_leaves_long_memory(
        client, database_url, fake_anthropic, settings, tmp_path):  # noqa: F811
    """After a rewind no recall or memory search finds what the abandoned branch said:
    its daily-note entries and their index rows go (the card it wrote stays: the scope's
    knowledge); what was said before the point stays, and the turns after are written on."""
    fake_anthropic.responder = rememberer
    vault, sid = tmp_path / "vault", f"r-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(sid)
        await session.ask("the words we keep")  # #1, #2
        await session.ask("remember Dana")  # #3 to #6
        await session.ask("the alarm code is 4417")  # #7, #8
        await transcribed(vault, sid, 8)
        card = (vault / CARD_FILE).read_bytes()
        assert await search_memory(database_url, "alarm code 4417", scope="default", k=5)
        await session.rewind(2)
        daily = ("SELECT seq FROM memory_docs WHERE session_id = %s AND kind = 'daily'"
                 " ORDER BY seq")
        for _ in range(100):  # the day files first, then the index rows (a crash between
            # leaves the index naming entries gone, which the forget's retry deletes)
            if entries(vault, sid) == 2 and len(db(database_url, daily, sid)) == 2:
                break
            await asyncio.sleep(0.1)
        days = "".join(f.read_text() for f in (vault / "daily").glob("*.md"))
        assert "the words we keep" in days and "4417" not in days and "Dana" not in days
        assert db(database_url, daily, sid) == [(1,), (2,)]
        assert not await search_memory(database_url, "alarm code 4417", scope="default", k=5)
        assert (vault / CARD_FILE).read_bytes() == card
        await session.ask("after the rewind")  # #9, #10
        await transcribed(vault, sid, 10)
        assert entries(vault, sid) == 4
