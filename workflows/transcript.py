"""Transcript: the vault's daily transcript of a session's turns, appended in the background.

Invariant: after a turn's reply, its inputs and replies (and its recall's hits, for their
access count) are appended by one ordinary activity at a time, on the vault's queue, in the
background: the next turn does not wait for it, and the run ends (or continues as new) only
once it is done. A failed append is said (`last_error`, an ErrorEvent where "memory") and
never holds a turn up; the record keeps the messages, and the nightly rollup reads the
record too.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.vault.turn import MemoryActivities, TranscriptsInput
    from schemas.events import ErrorEvent
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
        count): appended by one activity at a time, so the next turn does not wait."""
        if self.run.state.config.memory_scope is None or not (seqs or recalled):
            return
        self.seqs.extend(seqs)
        self.recalled.extend(recalled)
        if not self.busy:
            self.busy = True
            self.run.hold(self._append())  # held, as the fences are, until done

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
                    message = f"the transcript of {what} could not be written: {reason(err)}"
                    run.last_error = message
                    run.events.emit(ErrorEvent, turn=run.state.turn, message=message,
                                    where="memory")
        finally:
            self.busy = False
