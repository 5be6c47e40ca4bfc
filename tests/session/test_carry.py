"""What continue-as-new carries (workflows.carry): the checkpoint's mind, memo and now stay in
PostgreSQL and come back by the checkpoint id; the carried replies and events stay small."""

from __future__ import annotations

import json
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.exceptions import ApplicationError

from keel._errors import refusals
from keel.client import KeelError, session_config
from schemas.messages import REPLY_INLINE_CHARS
from schemas.session import (
    Handler,
    ReadReply,
    Rejection,
    ReplyPart,
    SessionState,
    TurnOutcome,
    UserMessage,
)
from tests.checkpoint_model import CheckpointModel, good_checkpoint
from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings
from workflows.carry import (
    CARRIED_REPLY_CHARS,
    NEWEST_REPLY_CHARS,
    OLDER_REPLY_CHARS,
    carried_outcomes,
    carried_state,
    query_text,
)


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


async def _starts(client, session_id: str) -> list[bytes]:
    """Each run's input as the server keeps it, oldest run first."""
    runs = [r async for r in client.list_workflows(f"WorkflowId = '{session_id}'")]
    out = []
    for run in sorted(runs, key=lambda r: r.start_time):
        history = await client.get_workflow_handle(session_id, run_id=run.run_id
                                                   ).fetch_history()
        first = history.events[0]
        assert first.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED
        out.append(b"".join(p.data for p in
                            first.workflow_execution_started_event_attributes.input.payloads))
    return out


async def test_the_checkpoint_texts_come_back_by_reference_after_continue_as_new(
        client, settings, fake_anthropic):
    long_reply = "r" * 10_000
    model = CheckpointModel(good_checkpoint, ordinary=lambda body: text_message(long_reply))
    fake_anthropic.responder = model
    cfg = session_config(settings, continue_as_new_after_events=60)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"carry-{uuid.uuid4().hex[:8]}", config=cfg)
        await session.ask("Please finish the user's long job, step by step.")
        await session.checkpoint_now()
        mind, memo, now = await session.mind(), await session.memo(), await session.now()
        assert "Finish the user's long job" in mind and memo and now
        for i in range(12):
            await session.ask(f"step {i}")
        starts = await _starts(client, session.session_id)
        assert len(starts) > 2  # it continued as new, more than once
        assert (await session.mind(), await session.memo(), await session.now()) == (
            mind, memo, now)
        status = await session.status()
    assert status.checkpoint_count == 1 and status.last_error is None
    for carried in starts[1:]:
        state = json.loads(carried)["state"]
        assert state["texts_in_store"] and state["checkpoint_id"]
        assert state["mind_text"] == state["memo_text"] == state["now_text"] == ""
        assert len(carried) < 64 * 1024  # 16 replies of 8,000 characters before
        replies = [o["reply_text"] for o in state["recent_outcomes"]]
        assert all(len(r) < OLDER_REPLY_CHARS + 100 for r in replies[:-1])
        assert len(replies[-1]) <= NEWEST_REPLY_CHARS


def test_carried_outcomes_keep_the_newest_longest_and_say_where_the_rest_is() -> None:
    outcomes = [TurnOutcome(turn=t, input_seqs=[2 * t], reply_seq=2 * t + 1,
                            reply_text=f"{t}" * 20_000) for t in range(1, 21)]
    kept = carried_outcomes(outcomes + outcomes[-1:], bounded=True, small=True)
    assert [o.turn for o in kept] == list(range(5, 21))  # sixteen, distinct, in order
    assert kept[-1].reply_text == "20" * (NEWEST_REPLY_CHARS // 2)
    assert all(o.reply_cut and o.reply_chars == 20_000 * len(str(o.turn)) for o in kept)
    assert all(len(o.reply_text) == OLDER_REPLY_CHARS for o in kept[:-1])
    old = carried_outcomes(outcomes, bounded=True, small=False)
    assert all(o.reply_text.endswith(f"message #{o.reply_seq} of the record]") for o in old)
    assert all(len(o.reply_text) < CARRIED_REPLY_CHARS + 80 for o in old)
    assert carried_outcomes(outcomes, bounded=False, small=False)[0].reply_text == "5" * 20_000


def test_the_texts_leave_the_state_only_when_a_checkpoint_holds_them() -> None:
    state = SessionState(session_id="s", mind_text="m", memo_text="e", now_text="n")
    assert carried_state(state, small=True) is state  # no checkpoint: nothing to read back
    state.checkpoint_id = "ckpt:1"
    carried = carried_state(state, small=True)
    assert (carried.mind_text, carried.texts_in_store, state.mind_text) == ("", True, "m")
    assert carried_state(state, small=False) is state
    with pytest.raises(ApplicationError) as refused:
        query_text(carried, carried.mind_text)
    assert refused.value.type == Rejection.TEXTS_LOADING
    assert query_text(state, "m") == "m"


async def test_a_long_reply_travels_as_its_start_and_the_client_reads_the_rest(
        client, settings, fake_anthropic):
    reply = "".join(f"<{i}>".ljust(1_000, ".") for i in range(50))  # 50,000 characters
    fake_anthropic.responder = lambda body: text_message(reply)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"carry-{uuid.uuid4().hex[:8]}")
        outcome = await session.ask("write it all")
        raw = await session.handle.execute_update(
            Handler.ASK, UserMessage(text="once more", input_id="raw-1"),
            result_type=TurnOutcome)
        part = await session.handle.execute_update(
            Handler.READ_REPLY, ReadReply(seq=raw.reply_seq, start=49_990),
            result_type=ReplyPart)
        with pytest.raises(KeelError, match="no message #999"):
            async with refusals(session.handle):
                await session.handle.execute_update(
                    Handler.READ_REPLY, ReadReply(seq=999), result_type=ReplyPart)
        history = await session.handle.fetch_history()
    assert outcome.reply_text == reply and not outcome.reply_cut
    assert raw.reply_cut and raw.reply_chars == 50_000
    assert raw.reply_text == reply[:REPLY_INLINE_CHARS]
    assert (part.text, part.total_chars) == (reply[49_990:], 50_000)
    # No event of the run carries the reply whole: the model call's result, the Update's.
    sizes = [e.ByteSize() for e in history.events]
    assert max(sizes) < REPLY_INLINE_CHARS + 8_000
