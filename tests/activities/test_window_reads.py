"""What a model call reads before it builds its request, in one round trip (`read_window`):
the window's rows with the checkpoint's carried ones first, rewound rows left out, the
reply a retry finds recorded, the scope mirrored on the session's row; and the checkpoint
turn's loader (`WindowLoader.rows`) reads the same rows."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack

import psycopg
import pytest
from temporalio.exceptions import ApplicationError

from activities.model_call import (
    MemoryStep,
    ModelAsk,
    ModelCallInput,
    RecordStep,
    WindowSpan,
    read_window,
    record_and_read,
)
from activities.prompt import SessionPrompt
from activities.record import RecordInput
from activities.window import WindowLoader
from schemas.checkpoint.policy import ModelWindow
from schemas.messages import MessageType

SID = "reads-1"


def _seed(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO sessions (session_id, memory_scope) VALUES (%s, 'old')",
                     (SID,))
        for seq in range(1, 11):
            kind = "user" if seq % 2 else "assistant"
            conn.execute(
                "INSERT INTO messages (session_id, seq, input_id, type, content_text,"
                " token_count, turn) VALUES (%s, %s, %s, %s, %s, 1, 1)",
                (SID, seq, f"in-{seq}", kind, f"row {seq}"))
        conn.execute("UPDATE messages SET rewound_by = 'rw-1' WHERE session_id = %s AND"
                     " seq IN (3, 8)", (SID,))
        conn.execute(
            "INSERT INTO checkpoints (checkpoint_id, session_id, kind, record_seq, cut_seq,"
            " upto_seq, mind_text, mind_context_text, memo, now_text, rendered,"
            " rendered_tokens, carried_seqs) VALUES ('ck-1', %s, 'model', 5, 5, 5, 'm', 'm',"
            " '[]', 'n', 'the checkpoint', 2, %s)", (SID, json.dumps([1, 3, 7])))


def _call(*, checkpoint: str | None, start: int = 6, upto: int = 9,
          reply: int = 10) -> ModelCallInput:
    return ModelCallInput(
        session_id=SID, turn=2, reply_seq=reply,
        span=WindowSpan(start_seq=start, upto_seq=upto, checkpoint_id=checkpoint),
        ask=ModelAsk(model="m",
                     window=ModelWindow(context_window=16_000, max_output_tokens=512)),
        memory=MemoryStep(scope="new"))


async def test_one_read_gives_the_window_the_reply_and_the_scope(database_url):
    _seed(database_url)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        reads = await read_window(conn, _call(checkpoint="ck-1"))
        # Carried 1 and 7 (3 was rewound; 7 lies inside the window already), then 6..9
        # without the rewound 8; the reply at 10 is found, not part of the window.
        assert [r.seq for r in reads.rows] == [1, 6, 7, 9]
        assert reads.checkpoint_text == "the checkpoint"
        assert reads.reply is not None and reads.reply.text == "row 10"
        assert reads.scope == "new"
        loader = WindowLoader(SessionPrompt(lambda: None, offline=True))
        rows, text = await loader.rows(conn, SID, 6, 9, "ck-1")
        assert [r.seq for r in rows] == [1, 6, 7, 9] and text == "the checkpoint"

        fresh = await read_window(conn, _call(checkpoint=None, start=4, upto=7, reply=11))
        assert [r.seq for r in fresh.rows] == [4, 5, 6, 7]
        assert fresh.reply is None and fresh.checkpoint_text is None

        with pytest.raises(ApplicationError, match="checkpoint ck-gone missing"):
            await read_window(conn, _call(checkpoint="ck-gone"))
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT memory_scope FROM sessions WHERE session_id = %s",
                           (SID,)).fetchone()
        assert row == ("new",)


class _Connections:
    """What `record_and_read` asks of the session's context: a connection of the record."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def connection(self) -> psycopg.AsyncConnection:
        return await psycopg.AsyncConnection.connect(self.url, autocommit=True)


@pytest.mark.parametrize("inputs", [1, 3])
async def test_the_first_calls_record_and_window_read_together_see_the_inputs(
        database_url, inputs: int) -> None:
    """The record step and the window's read share one pipeline, the reads sent behind
    the last input: the window holds every input just recorded, and a retry of the same
    call records nothing twice."""
    _seed(database_url)
    rows = [RecordInput(session_id=SID, seq=11 + i, input_id=f"in-new-{i}",
                        type=MessageType.USER, text=f"new {i}", turn=3) for i in range(inputs)]
    call = _call(checkpoint="ck-1", upto=10 + inputs, reply=11 + inputs).model_copy(
        update={"first": RecordStep(inputs=rows)})
    for attempt in range(2):
        async with AsyncExitStack() as stack:
            conn, recorded, reads = await record_and_read(
                _Connections(database_url), call, stack)  # type: ignore[arg-type]
            assert [r.seq for r in recorded] == [11 + i for i in range(inputs)]
            assert all(r.duplicate == bool(attempt) for r in recorded)
            assert [r.seq for r in reads.rows] == [1, 6, 7, 9, 10, *[r.seq for r in rows]]
            assert reads.rows[-1].text == f"new {inputs - 1}"
            assert reads.checkpoint_text == "the checkpoint" and not conn.closed
