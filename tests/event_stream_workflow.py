"""A small stand-in for SessionWorkflow, for the event-stream tests.

Invariant: it uses the stream exactly as the session is meant to: SessionEvents built in
`@workflow.init` from the input's carried state, events published from workflow code with
`workflow.now()`, text deltas published by an activity, subscribers released before every
wait for handlers, and the stream state carried over continue-as-new (every `can_every`
events published in a run).
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from temporalio.contrib.workflow_streams import WorkflowStreamState

    from activities.events import DeltaPublisher
    from schemas.events import (
        DeltaTail,
        InputRecorded,
        SessionEnded,
        SessionStopped,
        TextDelta,
        ToolCalled,
        ToolResult,
        TurnEnded,
        TurnStarted,
        tail_deltas,
    )
    from workflows.events import SessionEvents


class Say(BaseModel):
    chunks: list[str]  # the "model" generates these, one after another
    gap_ms: int = 0  # between chunks


class StreamInput(BaseModel):
    session_id: str
    events: WorkflowStreamState | None = None  # the stream across continue-as-new
    can_every: int = 0  # continue-as-new once a run has published this many (0: never)
    retain_events: int = 1_000
    retain_bytes: int = 256_000
    next_seq: int = 1
    turn: int = 0
    run: int = 1
    queue: list[Say] = Field(default_factory=list)


class GenerateInput(BaseModel):
    session_id: str
    turn: int
    reply_seq: int
    chunks: list[str]
    gap_ms: int = 0


class Generated(BaseModel):
    text: str
    tail: DeltaTail | None = None  # what no delta carried, for the workflow to publish


@activity.defn
async def generate(data: GenerateInput) -> Generated:
    """The model call: streams its chunks as text deltas while "generating" them (while
    someone reads the stream), handing back the tail as the session's model call does."""
    async with DeltaPublisher.for_activity(data.session_id, data.turn, data.reply_seq,
                                           max_chars=200) as deltas:
        for chunk in data.chunks:
            if data.gap_ms:
                await asyncio.sleep(data.gap_ms / 1000)
            deltas.add(chunk)
        return Generated(text="".join(data.chunks), tail=await deltas.finish())


@workflow.defn
class EventStreamWorkflow:
    @workflow.init
    def __init__(self, input: StreamInput) -> None:
        self.input = input
        self.events = SessionEvents(input.session_id, input.events,
                                    retain_events=input.retain_events,
                                    retain_bytes=input.retain_bytes)
        self.start_offset = self.events.offset()
        self.queue: list[Say] = list(input.queue)
        self.next_seq = input.next_seq
        self.turn = input.turn
        self.stopped: str | None = None

    @workflow.update
    async def say(self, msg: Say) -> int:
        seq = self.next_seq
        self.next_seq += 1
        self.events.emit(InputRecorded, turn=self.turn + 1, kind="user", seq=seq,
                         source_line=f"user said {len(msg.chunks)} chunks")
        self.queue.append(msg)
        return seq

    @workflow.signal
    def stop(self, reason: str) -> None:
        self.stopped = reason

    @workflow.query
    def offset(self) -> int:
        return self.events.offset()

    @workflow.query
    def run_number(self) -> int:
        return self.input.run

    def _should_continue_as_new(self) -> bool:
        return (self.input.can_every > 0
                and self.events.offset() - self.start_offset >= self.input.can_every)

    @workflow.run
    async def run(self, input: StreamInput) -> int:
        while True:
            await workflow.wait_condition(
                lambda: bool(self.queue) or self.stopped is not None
                or self._should_continue_as_new())
            if self._should_continue_as_new() and self.stopped is None:
                self.events.detach()
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(StreamInput(
                    session_id=input.session_id, events=self.events.carry(),
                    can_every=input.can_every, retain_events=input.retain_events,
                    retain_bytes=input.retain_bytes,
                    next_seq=self.next_seq, turn=self.turn, run=input.run + 1,
                    queue=self.queue))
            if self.queue:
                await self._turn(self.queue.pop(0))
                continue
            break
        self.events.emit(SessionStopped, turn=self.turn, reason=self.stopped or "")
        self.events.emit(SessionEnded, turn=self.turn, reason=self.stopped)
        self.events.detach()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.events.offset()

    async def _turn(self, msg: Say) -> None:
        self.turn += 1
        reply_seq = self.next_seq
        self.next_seq += 1
        self.events.emit(TurnStarted, turn=self.turn, input_seqs=[reply_seq - 1])
        generated = await workflow.execute_activity(
            generate, GenerateInput(session_id=self.input.session_id, turn=self.turn,
                                    reply_seq=reply_seq, chunks=msg.chunks,
                                    gap_ms=msg.gap_ms),
            start_to_close_timeout=timedelta(seconds=60))
        text = generated.text
        if generated.tail is not None:  # as workflows.turn publishes it
            for index, start, piece in tail_deltas(generated.tail, text):
                self.events.emit(TextDelta, turn=self.turn, reply_seq=reply_seq,
                                 attempt=generated.tail.attempt, index=index, start=start,
                                 text=piece)
        call = {"path": "notes.md", "content": text}
        self.events.emit(ToolCalled, turn=self.turn, tool_use_id=f"tu-{self.turn}",
                         name="write_file", input=json.dumps(call))
        self.events.emit(ToolResult, turn=self.turn, tool_use_id=f"tu-{self.turn}",
                         name="write_file", output=f"wrote {len(text)} chars")
        self.events.emit(TurnEnded, turn=self.turn, reply_seq=reply_seq,
                         reply_chars=len(text), reply_preview=text)
