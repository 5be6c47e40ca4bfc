"""Branching a session end to end: fork, rewind, and a crash in the middle of a fork,
through a real worker, PostgreSQL and the fake Messages API (which keeps every request)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import psycopg
import pytest
from temporalio.client import WorkflowFailureError

from keel.client import BranchRefusedError, NotPendingError
from schemas.branch import FORK_WORKFLOW, ForkCopy, ForkDone
from tests.checkpoint_model import texts
from tests.harness import keel_worker, small_config
from tests.session.branching import checkpointed, db, notes, settings, user_request  # noqa: F401


def same_request(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["system"] == b["system"]
    assert a["messages"] == b["messages"]
    assert a.get("tools") == b.get("tools")


async def test_fork_sends_what_the_origin_sent_there(client, settings, fake_anthropic,  # noqa: F811
                                                     database_url):
    async with keel_worker(client, settings) as keel:
        origin, seqs = await checkpointed(keel, fake_anthropic)
        assert (await origin.status()).checkpoint_count == 1
        before = db(database_url, "SELECT seq, content_text FROM messages WHERE"
                    " session_id = %s ORDER BY seq", origin.session_id)

        just_after = await keel.fork(origin.session_id, checkpoint=1)
        assert just_after.at_seq == seqs["after_checkpoint"]
        fork_a = keel.session(just_after.session_id)
        assert await notes(fork_a) == "one"
        await fork_a.ask("third message")

        inside = await keel.fork(origin.session_id, at_seq=seqs["inside"])
        fork_b = keel.session(inside.session_id)
        assert await notes(fork_b) == "two"
        assert (await fork_b.mind()) == (await origin.mind())
        await fork_b.ask("fifth message")

    asked = [r for r in fake_anthropic.requests if texts(r["messages"][-1])[-1:]
             in (["third message"], ["fifth message"])]
    assert len(asked) == 4  # the origin's two and the forks' two
    same_request(asked[0], asked[2])
    same_request(asked[1], asked[3])
    assert asked[2]["messages"][0]["content"][0]["text"].startswith("<recollection>")
    # The origin is untouched; each copied row says where it came from.
    assert db(database_url, "SELECT seq, content_text FROM messages WHERE session_id = %s"
              " ORDER BY seq", origin.session_id) == before
    copied = db(database_url, "SELECT seq, origin_session, origin_seq FROM messages"
                " WHERE session_id = %s AND seq <= %s", inside.session_id, inside.at_seq)
    assert copied and all(o == origin.session_id and s == os for s, o, os in copied)
    assert db(database_url, "SELECT origin_session, origin_seq, origin_kind FROM sessions"
              " WHERE session_id = %s", inside.session_id) == [
        (origin.session_id, seqs["inside"], "fork")]


async def test_fork_is_refused_inside_a_tool_round_and_past_the_record(
        client, settings, fake_anthropic):  # noqa: F811
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(
            f"b-{uuid.uuid4().hex[:8]}", config=small_config(settings, memory_scope=None))
        await session.ask("write one")  # user #1, tool call #2, result #3, reply #4
        with pytest.raises(BranchRefusedError, match="inside a tool round"):
            await keel.fork(session.session_id, at_seq=2)
        with pytest.raises(BranchRefusedError, match="past the newest row"):
            await keel.fork(session.session_id, at_seq=99)
        with pytest.raises(BranchRefusedError, match="no checkpoint 1"):
            await keel.fork(session.session_id, checkpoint=1)
        # Under an id that cannot name a session: refused by the client, and by the fork's
        # own step when another client asks for it.
        with pytest.raises(BranchRefusedError, match="may not hold a slash"):
            await keel.fork(session.session_id, new_id="tenant/fork")
        state = await session.state()
        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(FORK_WORKFLOW, ForkCopy(
                request_id=f"raw-{uuid.uuid4().hex}", origin=session.session_id,
                new_session="..", origin_state=state), id=f"raw-{uuid.uuid4().hex[:8]}",
                task_queue=settings.task_queue, result_type=ForkDone)
        assert "cannot be a session id" in str(failed.value.cause)


async def test_a_fork_that_fails_midway_leaves_nothing_and_a_retry_makes_one(
        client, settings, fake_anthropic, database_url):  # noqa: F811
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(
            f"b-{uuid.uuid4().hex[:8]}", config=small_config(settings, memory_scope=None))
        await session.ask("write one")
        new_id = f"{session.session_id}-f"
        # Another transaction holds the workspace's table: the fork's copy gets as far as
        # the workspace, waits its lock timeout and fails (and is retried) meanwhile.
        with psycopg.connect(database_url) as holder:
            holder.execute("LOCK TABLE workspace_files IN EXCLUSIVE MODE")
            forking = asyncio.create_task(keel.fork(session.session_id, new_id=new_id,
                                                    request_id="req-1"))
            await asyncio.sleep(7)  # past one lock timeout
            assert db(database_url, "SELECT count(*) FROM sessions WHERE session_id = %s",
                      new_id) == [(0,)]
            assert db(database_url, "SELECT count(*) FROM messages WHERE session_id = %s",
                      new_id) == [(0,)]
            holder.rollback()
        done = await forking
        again = await keel.fork(session.session_id, new_id=new_id, request_id="req-1")
        assert again == done
        assert await notes(keel.session(new_id)) == "one"
    assert db(database_url, "SELECT count(*) FROM messages WHERE session_id = %s",
              new_id) == [(done.rows_copied,)]


async def test_rewind_abandons_the_rows_after_the_point_for_good(
        client, settings, fake_anthropic, database_url):  # noqa: F811
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(
            f"b-{uuid.uuid4().hex[:8]}", config=small_config(settings, memory_scope=None))
        await session.ask("write one")  # #1 to #4
        await session.ask("second message")  # #5, #6
        await session.ask("write two")  # #7 to #10
        await session.ask("abandoned words")  # #11, #12
        with pytest.raises(BranchRefusedError, match="inside a tool round"):
            await session.rewind(8)
        with pytest.raises(BranchRefusedError, match="not in this session's record"):
            await session.rewind(40)
        done = await session.rewind(6)
        assert (done.rows_rewound, done.first_rewound, done.last_rewound) == (6, 7, 12)
        assert await notes(session) == "one"
        await session.ask("new direction")
        await session.ask("and on")
        status = await session.status()
    sent = user_request(fake_anthropic, "new direction")
    # The context as it stood at #6: the request that once carried "write two" less that
    # message, then the new one.
    assert sent["messages"][:-1] == user_request(fake_anthropic, "write two")["messages"][:-1]
    for request in (sent, user_request(fake_anthropic, "and on")):
        said = str(request["messages"])
        assert "abandoned words" not in said and "write two" not in said
    marks = db(database_url, "SELECT seq, rewound_by IS NOT NULL FROM messages"
               " WHERE session_id = %s ORDER BY seq", session.session_id)
    assert [s for s, r in marks if r] == list(range(7, 13))
    assert [s for s, r in marks if not r][-4:] == [13, 14, 15, 16]
    assert status.phase == "idle" and status.last_seq == 16


async def test_rewind_before_a_checkpoint_leaves_it(client, settings, fake_anthropic):  # noqa: F811
    async with keel_worker(client, settings) as keel:
        session, seqs = await checkpointed(keel, fake_anthropic)
        assert await session.mind()
        done = await session.rewind(seqs["after_checkpoint"] - 1)
        assert done.checkpoint is None and done.checkpoint_count == 0
        assert await session.mind() == "" and await notes(session) == "one"
        await session.ask("after the rewind")
        assert (await session.status()).window_start_seq == 1
    sent = user_request(fake_anthropic, "after the rewind")
    assert "<recollection>" not in str(sent["messages"])
    assert "third message" not in str(sent["messages"])


async def test_rewind_cancels_a_call_waiting_on_a_person(client, settings, fake_anthropic,  # noqa: F811
                                                         database_url):
    from schemas.agent import AgentSpec, ApprovalPolicy, ApprovalRules

    spec = AgentSpec(approvals=ApprovalRules(tools={"write_file": ApprovalPolicy.ASK}))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(
            f"b-{uuid.uuid4().hex[:8]}", agent=spec,
            config=small_config(settings, memory_scope=None))
        await session.ask("hello")  # #1, #2
        accepted = await session.send("write one")  # #3, the call #4, its wait's notice
        # Until the turn waits on the approval: it is listed a moment before (a rewind
        # then is refused, seen on a loaded run).
        while not (pending := await session.pending()) or (
                await session.status()).phase != "awaiting_approval":
            await asyncio.sleep(0.1)
        # The phase is set before the wait's notice is recorded (an activity); until the
        # call waits, a rewind is refused as asked too soon (seen at -n 4).
        deadline = time.monotonic() + 30
        while True:
            with pytest.raises(BranchRefusedError) as refused:
                await session.rewind(4)
            if "ask again in a moment" not in str(refused.value) \
                    or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert "not before the call that waits" in str(refused.value)
        with pytest.raises(BranchRefusedError, match="inside a tool round"):
            await keel.fork(session.session_id)  # now: the call waits for its result
        early = await keel.fork(session.session_id, at_seq=2)
        assert early.rows_copied == 2
        asked = len(fake_anthropic.requests)
        done = await session.rewind(2)
        outcome = await session.wait_reply(accepted.seq)
        assert outcome.interrupted and not await session.pending()
        assert len(fake_anthropic.requests) == asked  # the model was not asked again
        assert done.first_rewound == 3 and await notes(session) is None
        with pytest.raises(NotPendingError):  # the cancelled wait is no longer pending
            await session.approve(pending[0].call_id)
        await session.ask("after the rewind")
    results = db(database_url, "SELECT content_text, rewound_by IS NOT NULL FROM messages"
                 " WHERE session_id = %s AND type = 'tool_result'", session.session_id)
    assert results == [("cancelled: the session was rewound to #2", True)]
    sent = user_request(fake_anthropic, "after the rewind")
    assert "write one" not in str(sent["messages"]) and "cancelled" not in str(
        sent["messages"])


async def test_a_worker_lost_in_the_middle_of_a_fork_leaves_no_half_session(
        client, settings, fake_anthropic, database_url):  # noqa: F811
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(
            f"b-{uuid.uuid4().hex[:8]}", config=small_config(settings, memory_scope=None))
        await session.ask("write one")
    new_id = f"{session.session_id}-lost"
    with psycopg.connect(database_url) as holder:
        holder.execute("LOCK TABLE workspace_files IN EXCLUSIVE MODE")
        async with keel_worker(client, settings) as keel:
            forking = asyncio.create_task(keel.fork(session.session_id, new_id=new_id,
                                                    request_id="req-lost"))
            await asyncio.sleep(2)  # the copy is under way, waiting on the lock
        # That worker is gone, its transaction with it.
        assert db(database_url, "SELECT count(*) FROM messages WHERE session_id = %s",
                  new_id) == [(0,)]
        holder.rollback()
    async with keel_worker(client, settings) as keel:
        done = await asyncio.wait_for(forking, 60)  # another worker finishes the fork
        assert await notes(keel.session(new_id)) == "one"
    assert db(database_url, "SELECT count(*) FROM messages WHERE session_id = %s",
              new_id) == [(done.rows_copied,)]
