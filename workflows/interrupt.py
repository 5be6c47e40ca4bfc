"""Interrupting a running turn (the policy's rules are pure, in `schemas.interrupt`).

Invariants:
- A turn is asked to stop by a message sent with policy `interrupt` (as it is recorded)
  or by the `interrupt` Update (a stop button). The running model call, if any, is stopped
  at once through `SessionActivities.interrupt_model_call`, an ordinary activity
  (activities.interrupt) that the asking handler does not wait for: the message is
  recorded meanwhile, and a stop button answers at once (before `INTERRUPT_BY_ACTIVITY`,
  a local activity, awaited): its
  reply is recorded with what streamed so far, marked interrupted, and the turn ends there.
  A tool call already started finishes and is recorded; the reply's calls not yet started
  get a "not run" result (every call keeps exactly one result), a call waiting on a
  person's approval is denied ("the turn was interrupted"), a pause on the budget ends; no
  further model call is made in that turn. The message that interrupted starts the next turn.
- A stop asked between turns, or of a turn that has already made its last call, changes
  nothing. The request lasts for the turn it was asked in only.
- Nothing here issues a command unless a stop is asked: histories recorded before it
  replay unchanged.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.session import InterruptInput, SessionActivities
    from schemas.events import TurnInterrupted
    from schemas.interrupt import BusyAction, busy_action, choose_policy, rejected_text
    from schemas.session import Rejection, SessionPhase, UserMessage
    from workflows.failures import reason
    from workflows.options import INTERRUPT_CALL, INTERRUPT_LOCAL_CALL
    from workflows.run import SessionRun

__all__ = ["INTERRUPT_BY_ACTIVITY", "INTERRUPT_PATCH", "Interrupter"]

INTERRUPT_PATCH = "interrupt-turn"
# The stop sent by an ordinary activity: a local one holds the workflow task open while it
# runs, so one stuck on a database going down would hold the whole session.
INTERRUPT_BY_ACTIVITY = "interrupt-by-activity"


class Interrupter:
    """The running turn's stop request, and the model call it stops."""

    def __init__(self, run: SessionRun) -> None:
        self.run = run
        self.calling: int | None = None  # the reply seq of the model call in flight
        self.requested_in: int | None = None  # the turn a stop was asked in
        self._sent: set[int] = set()  # calls already told to stop
        self._sending: set[asyncio.Task[None]] = set()  # stops on their way

    # ----- what a message does ------------------------------------------------------------

    def busy(self) -> bool:
        return self.run.phase not in (SessionPhase.IDLE, SessionPhase.STOPPED,
                                      SessionPhase.ENDED)

    def action(self, message: UserMessage) -> BusyAction:
        agent = self.run.state.config.agent
        policy = choose_policy(message.on_busy, agent.on_busy if agent else None)
        return busy_action(policy, busy=self.busy())

    def refusal(self) -> tuple[str, str]:
        """The reason and type of a refused message."""
        return rejected_text(self.run.state.turn), Rejection.BUSY

    # ----- the turn's side ---------------------------------------------------------------

    @property
    def requested(self) -> bool:
        return self.requested_in is not None and self.requested_in == self.run.state.turn

    def start_turn(self) -> None:
        self.requested_in = None

    def stop_quietly(self) -> None:
        """The turn asks the model no more once its calls have their results (a rewind
        cancelled its wait, workflows.branch); no model call is in flight then."""
        self.requested_in = self.run.state.turn

    async def stop(self, *, by_message: bool = False) -> bool:
        """Ask the running turn to stop; True when a turn was running to stop. `by_message`:
        a message sent with policy `interrupt` asked (else the interrupt Update)."""
        if not self.busy():
            return False
        workflow.patched(INTERRUPT_PATCH)
        if not self.requested:
            self.run.events.emit(TurnInterrupted, turn=self.run.state.turn,
                                 by_message=by_message)
        self.requested_in = self.run.state.turn
        seq = self.calling
        if seq is not None and seq not in self._sent:
            self._sent.add(seq)
            stop = InterruptInput(session_id=self.run.state.session_id, reply_seq=seq)
            if workflow.patched(INTERRUPT_BY_ACTIVITY):
                # Not awaited: the message that asked is recorded meanwhile (its activity
                # goes out in the same workflow task), and a stop button answers at once.
                task = asyncio.create_task(self._send(stop, by_activity=True))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)
            else:  # recorded before: a local activity, awaited
                await self._send(stop, by_activity=False)
        return True

    async def _send(self, stop: InterruptInput, *, by_activity: bool) -> None:
        try:
            if by_activity:
                await workflow.execute_activity_method(
                    SessionActivities.interrupt_model_call, stop, **INTERRUPT_CALL)
            else:
                await workflow.execute_local_activity_method(
                    SessionActivities.interrupt_model_call, stop, **INTERRUPT_LOCAL_CALL)
        except ActivityError as err:  # the call ends on its own; the turn still stops
            self.run.last_error = f"the model call could not be interrupted: {reason(err)}"
