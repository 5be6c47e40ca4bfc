"""The Temporal Schedules behind recurring wakeups: made and deleted by the session's own
worker, through the client its activities run with (`activity.client()`); made by an
import for the wakeups its session brings (keel.branching).

Invariants:
- One schedule per recurring wakeup, its id `wakeup_schedule_id(session, wakeup)`: a retried
  create finds it made and succeeds, a retried delete finds it gone and succeeds. A session
  only ever holds its own schedules' ids (an import renames what its bundle's state held).
- An interval's fires are the wakeup's creation (up to the whole second) plus whole
  intervals (`interval_offset`): the first comes one interval after it was scheduled,
  never while the schedule's own workflow is still starting.
- The schedule starts `WakeupFireWorkflow` (workflows.wakeups) on the session's task queue,
  which signals the session; it runs from the wakeup's creation to its expiry (`end_at`), so
  Temporal itself stops it at the expiry, and a fire still due when the next comes is
  skipped, never doubled.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.heartbeat import beating
from schemas.initiative import Wakeup, interval_offset, interval_schedule_start

__all__ = ["WAKEUP_FIRE_WORKFLOW", "WakeupFire", "WakeupScheduleInput",
           "create_wakeup_schedule", "delete_wakeup_schedule", "make_wakeup_schedule",
           "wakeup_schedule_id"]

WAKEUP_FIRE_WORKFLOW = "KeelWakeupFire"


class WakeupFire(BaseModel):
    """The fire workflow's input: whose wakeup to signal."""

    session_id: str
    wakeup_id: str


class WakeupScheduleInput(BaseModel):
    session_id: str
    wakeup: Wakeup
    task_queue: str


def wakeup_schedule_id(session_id: str, wakeup_id: str) -> str:
    return f"keel-wakeup-{session_id}-{wakeup_id}"


@activity.defn(name="create_wakeup_schedule")
@beating
async def create_wakeup_schedule(data: WakeupScheduleInput) -> str:
    return await make_wakeup_schedule(activity.client(), data)


async def make_wakeup_schedule(client: Client, data: WakeupScheduleInput) -> str:
    """The wakeup's schedule made through `client` (there already: left as it is); its id.
    The session's activity, and an import that brings a session with its wakeups."""
    wakeup = data.wakeup
    sid = wakeup_schedule_id(data.session_id, wakeup.id)
    spec = ScheduleSpec(
        cron_expressions=[wakeup.cron] if wakeup.cron else [],
        intervals=[ScheduleIntervalSpec(every=timedelta(seconds=wakeup.every_s),
                                        offset=interval_offset(wakeup.created, wakeup.every_s))]
        if wakeup.every_s else [],
        start_at=interval_schedule_start(wakeup.created) if wakeup.every_s else wakeup.created,
        end_at=wakeup.expires, time_zone_name="UTC")
    schedule = Schedule(
        action=ScheduleActionStartWorkflow(
            WAKEUP_FIRE_WORKFLOW, WakeupFire(session_id=data.session_id, wakeup_id=wakeup.id),
            id=f"{sid}-fire", task_queue=data.task_queue),
        spec=spec, policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP))
    try:
        await client.create_schedule(sid, schedule)
    except ScheduleAlreadyRunningError:  # a retry (the activity's, the import's): it is there
        pass
    return sid


@activity.defn(name="delete_wakeup_schedule")
@beating
async def delete_wakeup_schedule(schedule_id: str) -> None:
    try:
        await activity.client().get_schedule_handle(schedule_id).delete()
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
