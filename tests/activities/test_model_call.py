"""ModelCallInput is a durable payload: grouped now, it still takes the flat shape that
older code wrote to histories and that the workflow builds by keyword."""

from __future__ import annotations

from temporalio.contrib.pydantic import pydantic_data_converter

from activities.model_call import (
    MemoryStep,
    ModelAsk,
    ModelCallInput,
    ModelCallResult,
    RecordInput,
    RecordStep,
    RoomSteps,
    WindowSpan,
)
from schemas.checkpoint.policy import ModelWindow
from schemas.messages import MessageType
from schemas.vault.recall import RecallInput

WINDOW = ModelWindow(context_window=200_000, max_output_tokens=8_000)
FLAT = {
    "session_id": "s1", "turn": 3, "reply_seq": 12, "window_start_seq": 4, "upto_seq": 11,
    "checkpoint_id": "ckpt:a", "model": "claude", "window": WINDOW.model_dump(mode="json"),
    "usage_ratio": 1.2, "room_asked": True, "cut_newest_output": True,
    "memory_block": "<m/>", "keep_recent_seq": 9, "memory_scope": "alice",
    "agent": None, "mcp_tools": [],
    "record": [{"session_id": "s1", "seq": 11, "input_id": "m-1", "type": "user",
                "text": "hi", "user_name": "ann"}],
    "record_within_s": 2.5, "recall": {"session_id": "s1", "query": "hi", "scope": "alice"},
}


def _check(call: ModelCallInput) -> None:
    assert (call.session_id, call.turn, call.reply_seq) == ("s1", 3, 12)
    assert (call.span.start_seq, call.span.upto_seq, call.span.checkpoint_id,
            call.span.keep_recent_seq) == (4, 11, "ckpt:a", 9)
    assert (call.ask.model, call.ask.window, call.ask.usage_ratio) == ("claude", WINDOW, 1.2)
    assert call.room.asked and call.room.cut_newest_output
    assert (call.memory.scope, call.memory.block) == ("alice", "<m/>")
    assert call.memory.recall == RecallInput(session_id="s1", query="hi", scope="alice")
    assert call.first.within_s == 2.5
    assert call.first.inputs[0].user_name == "ann"
    assert call.first.inputs[0].type is MessageType.USER


def test_the_flat_json_of_older_payloads_decodes():
    _check(ModelCallInput.model_validate(FLAT))


def test_the_flat_keywords_the_workflow_passes_still_build_it():
    kwargs = {**FLAT, "window": WINDOW, "record": [RecordInput(**FLAT["record"][0])],
              "recall": RecallInput(session_id="s1", query="hi", scope="alice")}
    _check(ModelCallInput(**kwargs))


def test_the_grouped_construction_is_the_flat_one():
    record = RecordInput(**FLAT["record"][0])
    recall = RecallInput(session_id="s1", query="hi", scope="alice")
    grouped = ModelCallInput(
        session_id="s1", turn=3, reply_seq=12,
        span=WindowSpan(start_seq=4, upto_seq=11, checkpoint_id="ckpt:a", keep_recent_seq=9),
        ask=ModelAsk(model="claude", window=WINDOW, usage_ratio=1.2),
        room=RoomSteps(asked=True, cut_newest_output=True),
        memory=MemoryStep(scope="alice", block="<m/>", recall=recall),
        first=RecordStep(inputs=[record], within_s=2.5))
    assert grouped == ModelCallInput.model_validate(FLAT)


def test_the_grouped_shape_round_trips_through_the_converter():
    converter = pydantic_data_converter
    call = ModelCallInput.model_validate(FLAT)
    payloads = converter.payload_converter.to_payloads([call])
    assert converter.payload_converter.from_payloads(payloads, [ModelCallInput]) == [call]


def test_defaults_match_the_flat_defaults():
    call = ModelCallInput(session_id="s", turn=1, reply_seq=2, window_start_seq=1,
                          upto_seq=1, model="m", window=WINDOW)
    assert call.span.checkpoint_id is None and call.span.keep_recent_seq == 0
    assert call.ask.usage_ratio == 1.0 and call.ask.agent is None and call.ask.mcp_tools == []
    assert not call.room.asked and not call.room.cut_newest_output
    assert (call.memory.scope, call.memory.block, call.memory.recall) == ("default", "", None)
    assert call.first.inputs == [] and call.first.within_s == 5.0


def test_an_old_result_still_decodes():
    old = {"reply": None, "fit": "fits", "estimated_tokens": 10, "output_cut": False,
           "notes": [], "recorded": [{"seq": 3, "token_count": 2}]}
    assert ModelCallResult.model_validate(old).recorded[0].seq == 3
