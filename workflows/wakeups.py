"""Wakeups the agent schedules for itself: the three tools, the timers, and the fire.

Invariants:
- A wakeup lives in `SessionState.wakeups` (carried over continue-as-new), so it survives
  a new run and a worker restart: a one-shot is a workflow timer made again by every run
  (`watch`), a recurring one a Temporal Schedule (activities.wakeups) that starts
  `WakeupFireWorkflow`, which signals the session (`Handler.WAKEUP`).
- It fires as a Task input whose source line Keel writes from the wakeup's id and note
  (`wakeup_source_line`), never from the text, so a note can never pass for the user. Its
  input id is the wakeup's id and fire (`wakeup-<id>-<n>` / the schedule's time), so a
  retried record or a doubled signal records it once.
- A one-shot leaves the state as it fires, before anything is awaited: a replay after a
  crash or a new run after continue-as-new never fires it twice. A fire that is being
  recorded holds continue-as-new (`firing`), and no fire starts once it has begun.
- A wakeup that fires while the session is idle starts its turn at once: the turn's first
  model call records it (workflows.inbox `fold_background`), as an asked message's, so from
  the timer (or the schedule's signal) to the model call is one workflow task.
- A wakeup due mid-turn or mid-checkpoint is recorded and waits its turn like any Task; one
  whose session has ended is dropped: the end deletes every schedule and a notice lists
  what was dropped, and a fire reaching a closed session ends with "dropped" as its result.
- A session without wakeups makes no command here (no timer, no activity): histories of
  sessions that never scheduled one replay as before.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.wakeups import (
        WAKEUP_FIRE_WORKFLOW,
        WakeupFire,
        WakeupScheduleInput,
        create_wakeup_schedule,
        delete_wakeup_schedule,
    )
    from schemas.events import WakeupFired
    from schemas.initiative import (
        RECURRING_FLOOR_S,
        Wakeup,
        WakeupRefused,
        WakeupSignal,
        plan_wakeup,
        wakeup_listing,
    )
    from schemas.messages import HarnessKind, MessageType, ToolCall, wakeup_source_line
    from schemas.session import Handler
    from schemas.text import make_storable
    from workflows.inbox import Inbox
    from workflows.options import RECORD_NOTICE
    from workflows.run import SessionRun
    from workflows.scheduled import scheduled_time

__all__ = ["FOLD_PATCH", "RECURRING_FLOOR_PATCH", "UNFIRED_PATCH", "ToolFn",
           "WakeupFireWorkflow", "Wakeups"]

# A fire while the session is idle is folded into its turn's first model call (histories
# from before it replay as they were: recorded by an activity of its own).
FOLD_PATCH = "wakeup-fold"
# Recurring wakeups at least RECURRING_FLOOR_S apart (histories from before it scheduled
# 1 s intervals and replay so).
RECURRING_FLOOR_PATCH = "wakeup-recurring-floor"
# A recurring wakeup whose first fire is past its expiry is refused (it was scheduled, and
# never fired).
UNFIRED_PATCH = "wakeup-unfired-refused"

ToolFn = Callable[[ToolCall], Awaitable[tuple[str, bool]]]


class Wakeups:
    """The wakeup side of one session run; the durable part is `SessionState.wakeups`."""

    def __init__(self, run: SessionRun, inbox: Inbox,
                 calling_seq: Callable[[], int | None] = lambda: None) -> None:
        self.run = run
        self.inbox = inbox
        self.firing = False  # a fire is being recorded: continue-as-new waits for it
        self.changes = 0  # bumped when the list changes, so `watch` times the new first
        self._task: asyncio.Task[None] | None = None
        self.calling_seq = calling_seq  # the assistant row of the call running now

    def tools(self) -> dict[str, ToolFn]:
        return {"schedule_wakeup": self.schedule, "list_wakeups": self.listing,
                "cancel_wakeup": self.cancel_call}

    def start(self) -> None:
        """The timer loop, in the background for this run."""
        self._task = asyncio.create_task(self.watch())

    # ----- the tools ---------------------------------------------------------------------

    async def schedule(self, call: ToolCall) -> tuple[str, bool]:
        state = self.run.state
        spec = state.config.agent
        if spec is None or spec.wakeups is None:
            return "This agent may not schedule wakeups.", True
        floor = RECURRING_FLOOR_S if (call.input.get("every_s") is not None and
                                      workflow.patched(RECURRING_FLOOR_PATCH)) else 0.0
        try:
            wakeup = plan_wakeup(call.input, workflow.now(), spec.wakeups, state.wakeups,
                                 f"w{state.wakeups_made + 1}", floor,
                                 refuse_unfired=workflow.patched(UNFIRED_PATCH))
        except WakeupRefused as err:
            return f"schedule_wakeup refused: {err}", True
        state.wakeups_made += 1
        wakeup.seq = self.calling_seq()
        if wakeup.recurring:
            wakeup.schedule_id = await self._make_schedule(wakeup)
            if wakeup.schedule_id is None:
                return "schedule_wakeup failed: the schedule could not be made", True
        state.wakeups.append(wakeup)
        self.changes += 1
        self.run.publish_summary()
        return f"Scheduled wakeup {wakeup.id}.\n{wakeup_listing([wakeup])}", False

    async def listing(self, call: ToolCall) -> tuple[str, bool]:
        return wakeup_listing(self.run.state.wakeups), False

    async def cancel_call(self, call: ToolCall) -> tuple[str, bool]:
        wakeup_id = str(call.input.get("id", ""))
        if await self.cancel(wakeup_id) is None:
            return f"There is no wakeup {wakeup_id!r} (list_wakeups lists them).", True
        return f"Cancelled wakeup {wakeup_id}.", False

    async def cancel(self, wakeup_id: str) -> Wakeup | None:
        """Remove a wakeup (its schedule too); None when there is no such wakeup."""
        state = self.run.state
        found = next((w for w in state.wakeups if w.id == wakeup_id), None)
        if found is None:
            return None
        state.wakeups = [w for w in state.wakeups if w.id != wakeup_id]
        self.changes += 1
        if found.schedule_id:
            await self._delete_schedule(found.schedule_id)
        return found

    async def cancel_after(self, seq: int) -> list[Wakeup]:
        """A rewind to `seq`: the wakeups a call after it scheduled are cancelled (their
        schedules deleted), and a notice names them."""
        gone = [w for w in self.run.state.wakeups if w.seq is not None and w.seq > seq]
        for wakeup in gone:
            await self.cancel(wakeup.id)
        if gone:
            self.run.publish_summary()
            await self.run.record_notice(
                f"The rewind to #{seq} cancelled the wakeups its abandoned rows scheduled: "
                + "; ".join(f"{w.id} ({w.note[:100]})" for w in gone))
        return gone

    # ----- schedules ---------------------------------------------------------------------

    async def _make_schedule(self, wakeup: Wakeup) -> str | None:
        try:
            sid: str = await workflow.execute_activity(
                create_wakeup_schedule,
                WakeupScheduleInput(session_id=self.run.state.session_id, wakeup=wakeup,
                                    task_queue=workflow.info().task_queue),
                **RECORD_NOTICE)
        except ActivityError as err:
            self.run.last_error = f"wakeup schedule not made: {err.cause or err}"
            return None
        return sid

    async def _delete_schedule(self, schedule_id: str) -> None:
        try:
            await workflow.execute_activity(delete_wakeup_schedule, schedule_id,
                                            **RECORD_NOTICE)
        except ActivityError as err:
            self.run.last_error = f"wakeup schedule {schedule_id} not deleted: {err.cause}"

    # ----- firing ------------------------------------------------------------------------

    def _next(self) -> tuple[datetime, Wakeup] | None:
        """The next thing due: a one-shot's time, or a recurring one's expiry."""
        times = [(w.due or w.expires, w) for w in self.run.state.wakeups]
        return min(times, key=lambda t: t[0]) if times else None

    async def watch(self) -> None:
        """Wait for the next one-shot (or expiry) and fire it, until the session stops or
        the run continues as new (the next run waits on the same state)."""
        state, run = self.run.state, self.run
        while state.stopped_reason is None and not run.continuing:
            seen = self.changes

            def moved(seen: int = seen) -> bool:
                return (self.changes != seen or state.stopped_reason is not None
                        or run.continuing)

            due = self._next()
            left = None if due is None else (due[0] - workflow.now()).total_seconds()
            if left is None or left > 0:
                try:
                    await workflow.wait_condition(
                        moved, timeout=None if left is None else timedelta(seconds=left))
                except TimeoutError:
                    pass
                continue
            assert due is not None
            wakeup = due[1]
            state.wakeups = [w for w in state.wakeups if w.id != wakeup.id]
            self.changes += 1
            if wakeup.recurring:  # its expiry: Temporal stopped the schedule already
                await self._expired(wakeup)
            else:
                wakeup.fired += 1
                await self._fire(wakeup, f"wakeup-{wakeup.id}-1")

    async def _expired(self, wakeup: Wakeup) -> None:
        if wakeup.schedule_id:
            await self._delete_schedule(wakeup.schedule_id)
        await self.run.record_notice(f"Wakeup {wakeup.id} expired after firing "
                                     f"{wakeup.fired} times: {wakeup.note}")

    async def _fire(self, wakeup: Wakeup, input_id: str) -> None:
        """Record the wakeup as a Task input (it waits its turn like any). While the
        session is idle it starts its turn at once: the turn's first model call records it
        (as an asked message's), no record activity and workflow task before it."""
        source_line = make_storable(wakeup_source_line(wakeup.id, wakeup.note))[0]
        when = "recurring" if wakeup.recurring else "one-shot"
        text = make_storable(f"Your {when} wakeup {wakeup.id} fired (fire "
                             f"{wakeup.fired}). Your note: {wakeup.note}")[0]
        if self.inbox.can_fold() and workflow.patched(FOLD_PATCH):
            seq = self.inbox.fold_background(HarnessKind.TASK.value, text, source_line,
                                             input_id)
            self.run.events.emit(WakeupFired, turn=self.run.state.turn + 1,
                                 wakeup_id=wakeup.id, seq=seq)
            self.run.publish_summary()
            return
        self.firing = True
        try:
            accepted = await self.inbox.record_input(
                HarnessKind.TASK.value, MessageType.HARNESS, text, source_line, input_id,
                patient=True, lost=f"A wakeup ({source_line})")
            self.run.events.emit(WakeupFired, turn=self.run.state.turn + 1,
                                 wakeup_id=wakeup.id, seq=accepted.seq)
        except ApplicationError as err:  # recorded already: the fence notice says so
            workflow.logger.error("wakeup %s not recorded: %s", wakeup.id, err)
        finally:
            self.firing = False
        self.run.publish_summary()

    async def signalled(self, args: Sequence[RawValue]) -> None:
        """A recurring wakeup's schedule fired (`Handler.WAKEUP`)."""
        state = self.run.state
        try:
            if len(args) != 1:
                raise ValueError(f"expected one argument, got {len(args)}")
            data = WakeupSignal.model_validate(json.loads(args[0].payload.data))
        except Exception as err:  # any undecodable payload is said
            await self.run.record_notice(f"A wakeup signal was malformed and dropped: "
                                         f"{str(err)[:300]}")
            return
        wakeup = next((w for w in state.wakeups if w.id == data.wakeup_id), None)
        at = data.fire_time or workflow.now()
        if wakeup is None or wakeup.due is not None or at > wakeup.expires:
            await self.run.record_notice(f"A schedule fired wakeup {data.wakeup_id[:100]}, "
                                         "which is not scheduled now: dropped.")
            return
        wakeup.fired += 1
        await self._fire(wakeup, f"wakeup-{wakeup.id}-{at.isoformat(timespec='seconds')}")

    async def drop_all(self) -> None:
        """The session ended: every wakeup is dropped, its schedule deleted, and a notice
        says which."""
        state = self.run.state
        dropped, state.wakeups = state.wakeups, []
        if not dropped:
            return
        self.changes += 1
        for wakeup in dropped:
            if wakeup.schedule_id:
                await self._delete_schedule(wakeup.schedule_id)
        await self.run.record_notice(
            "The session ended; its wakeups were dropped: "
            + "; ".join(f"{w.id} ({w.note[:100]})" for w in dropped))


@workflow.defn(name=WAKEUP_FIRE_WORKFLOW)
class WakeupFireWorkflow:
    """Started by a recurring wakeup's schedule: signals its session, once."""

    @workflow.run
    async def run(self, data: WakeupFire) -> str:
        signal = WakeupSignal(wakeup_id=data.wakeup_id, fire_time=scheduled_time(None))
        try:
            await workflow.get_external_workflow_handle(data.session_id).signal(
                Handler.WAKEUP, signal)
        except Exception as err:  # a closed session: the fire is dropped, said here
            return f"dropped: session {data.session_id} did not take the signal ({err})"
        return "delivered"

