"""The pre-pass across turns, as the prompt cache sees it (pure: `size_request` and the
request builder, no server): once the session is past the threshold, each old tool
output is shrunk the first time it is sent after its own turn and stays shrunk; no row
flips back to whole, and everything before the previous turn is the same bytes from one
turn's first request to the next, so that prefix is read from the cache."""

from __future__ import annotations

import json

from activities.model_call import (
    LoadedRequest,
    ModelAsk,
    ModelCallInput,
    WindowSpan,
    size_request,
)
from activities.window import LoadedWindow
from schemas.checkpoint.policy import Fit, ModelWindow
from schemas.messages import MessageType, RecordRow
from schemas.request import model_call_request
from schemas.tokens import count_tokens

WINDOW = ModelWindow(context_window=16_000, max_output_tokens=1_024)
OUTPUT = "\n".join(f"line {i} of the file: handler{i} case{i}" for i in range(120))
TOOLS = [{"name": "read_file", "description": "read", "input_schema": {"type": "object"}}]
REPLY = "Reviewed: approve. " + " ".join(f"point{i}" for i in range(60))


def _turn(turn: int, seq: int) -> list[RecordRow]:
    """One turn of a review queue: the user, a read_file call, its output, the review."""
    call = f"t{turn}"
    return [
        RecordRow(seq=seq, type=MessageType.USER, text="continue", token_count=1, turn=turn),
        RecordRow(seq=seq + 1, type=MessageType.ASSISTANT, text="", turn=turn, content=[
            {"type": "tool_use", "id": call, "name": "read_file", "input": {"path": "a"}}]),
        RecordRow(seq=seq + 2, type=MessageType.TOOL_RESULT, text=f"# file {turn}\n{OUTPUT}",
                  token_count=count_tokens(f"# file {turn}\n{OUTPUT}"), turn=turn,
                  content={"tool_use_id": call, "is_error": False}),
        RecordRow(seq=seq + 3, type=MessageType.ASSISTANT, text=f"{REPLY} {turn}", turn=turn,
                  token_count=count_tokens(f"{REPLY} {turn}"),
                  content=[{"type": "text", "text": f"{REPLY} {turn}"}]),
    ]


def _first_request(rows: list[RecordRow],
                   first_seq: int) -> tuple[list[RecordRow], Fit, list[dict]]:
    """A turn's first request over `rows` (its user message the last row)."""
    loaded = LoadedRequest(window=LoadedWindow(system="sys", rows=rows), tools=TOOLS,
                           memory_block="")
    data = ModelCallInput(session_id="s", turn=1, reply_seq=rows[-1].seq + 1,
                          span=WindowSpan(start_seq=1, upto_seq=rows[-1].seq,
                                          keep_recent_seq=first_seq),
                          ask=ModelAsk(model="m", window=WINDOW))
    sized = size_request(loaded, data)
    request, _ = model_call_request(model="m", max_tokens=100, system="sys", rows=sized.rows,
                                    checkpoint_text=None, memory_block="", tools=TOOLS,
                                    turn_first_seq=first_seq)
    return sized.rows, sized.size, request["messages"]


def _plain(messages: list) -> list[str]:
    return [json.dumps({k: v for k, v in b.items() if k != "cache_control"}, sort_keys=True)
            for m in messages for b in m["content"]]


def test_an_old_output_is_shrunk_once_and_each_turn_starts_with_the_last_ones_request() -> None:
    history: list[RecordRow] = []
    forms: dict[int, list[str]] = {}
    previous: list[str] | None = None
    prepassed_turns = 0  # turns whose previous turn was pre-passed too
    for turn in range(1, 21):
        seq = len(history) + 1
        rows = [*history, _turn(turn, seq)[0]]
        sent, size, messages = _first_request(rows, first_seq=seq)
        assert size is Fit.FITS  # the pre-pass alone makes room in this session
        for row in sent:
            seen = forms.setdefault(row.seq, [])
            if not seen or seen[-1] != row.text:
                seen.append(row.text)
        blocks = _plain(messages)
        if previous is not None and any("shrunk by the pre-pass" in b for b in previous):
            # Past the first crossing (which shrinks the backlog once), the previous turn's
            # first request is byte for byte the start of this one: only the previous
            # turn's own output is shrunk, the first time it is sent after its turn.
            prepassed_turns += 1
            assert blocks[:len(previous)] == previous
        previous = blocks
        history.extend(_turn(turn, seq))
    assert prepassed_turns >= 5  # the session was past the threshold for many turns
    # Each row is sent in at most two forms, whole then shrunk, and never whole again.
    for seq, seen in forms.items():
        assert len(seen) <= 2, (seq, seen)
        if len(seen) == 2:
            assert "shrunk by the pre-pass" in seen[1]
