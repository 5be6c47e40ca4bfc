"""Transcript: the vault's daily transcript of a session's turns, written off the turn.

Invariants:
- A model call that records a reply queues, in the reply's
  transaction, the transcript of the inputs it answers and of the reply
  (activities.vault.outbox); the vault worker drains it. The session schedules nothing
  after the reply: no activity, no workflow task. A row that fails for good is said to the
  session by the `transcript_failed` signal (`signalled`: `last_error`, an ErrorEvent where
  "memory").
- What no call queued (the inputs of a call that failed; histories from before the outbox,
  whose results lack `transcribed`)
  is appended here, after the turn, by one ordinary activity at a time, on the vault's
  queue, in the background: the next turn does not wait for it, and the run ends (or
  continues as new) only once it is done. A failed append is said the same way.
- Neither path holds a turn up: the record keeps the messages, and the nightly rollup
  reads the record too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.vault.turn import MemoryActivities, TranscriptsInput
    from schemas.events import ErrorEvent
    from schemas.session import TranscriptFailed
    from workflows.failures import reason
    from workflows.options import MEMORY_TURN, on_vault_queue
    from workflows.run import SessionRun

__all__ = ["Transcript"]


class Transcript:
    """The vault's daily transcript of a session's turns, appended in the background."""

    def __init__(self, run: SessionRun) -> None:
        self.run = run
        self.seqs: list[int] = []
        self.recalled: list[str] = []
        self.busy = False  # an append is running (the run's end waits for it)

    def add(self, seqs: list[int], recalled: list[str]) -> None:
        """Queue a turn's inputs and replies (and its recall's hits for their access
        count) that no model call queued: appended by one activity at a time, so the next
        turn does not wait."""
        if self.run.state.config.memory_scope is None or not (seqs or recalled):
            return
        self.seqs.extend(seqs)
        self.recalled.extend(recalled)
        if not self.busy:
            self.busy = True
            self.run.hold(self._append())  # held, as the fences are, until done

    async def signalled(self, args: Sequence[RawValue]) -> None:
        """The vault worker gave up on a queued transcript (`Handler.TRANSCRIPT_FAILED`)."""
        try:
            if len(args) != 1:
                raise ValueError(f"expected one argument, got {len(args)}")
            data = TranscriptFailed.model_validate(json.loads(args[0].payload.data))
        except Exception as err:  # any undecodable payload is said
            await self.run.record_notice("A transcript_failed signal was malformed and "
                                         f"dropped: {str(err)[:300]}")
            return
        self._failed(data.message)

    def _failed(self, message: str) -> None:
        run = self.run
        run.last_error = message
        run.events.emit(ErrorEvent, turn=run.state.turn, message=message, where="memory")

    async def _append(self) -> None:
        run = self.run
        scope = run.state.config.memory_scope
        try:
            while self.seqs or self.recalled:
                seqs, self.seqs = self.seqs, []
                recalled, self.recalled = self.recalled, []
                if scope is None:
                    continue
                try:
                    await workflow.execute_activity_method(
                        MemoryActivities.append_transcripts,
                        TranscriptsInput(session_id=run.state.session_id, seqs=seqs,
                                         scope=scope, recalled=recalled),
                        **on_vault_queue(MEMORY_TURN))
                except ActivityError as err:
                    # The record keeps the messages; the nightly rollup reads the record too.
                    what = f"#{seqs[0]}-#{seqs[-1]}" if seqs else "recalled notes"
                    self._failed(f"the transcript of {what} could not be written: "
                                 f"{reason(err)}")
        finally:
            self.busy = False
