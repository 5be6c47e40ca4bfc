"""The five Temporal Schedules of long memory: four rollups and the doctor.

Each schedule runs its job for every memory scope that has a vault
(`workflows.nightly.MemoryNightlyWorkflow`, one child workflow per scope): one schedule
per job, not per scope, so a scope made by a new person's first session is covered the
next night without anything creating or deleting schedules, and a scope's failure stays
inside its own child run.

Client code, run by the worker process at start-up. Cron specs run in the configured time
zone (server-local by default). A run missed while
the worker was down starts when it returns, within the catch-up window; a run still going
when the next is due makes that one skip, never overlap. A Temporal server that is away
when a worker starts (restarting beside it) delays the schedules, never the worker:
`keep_memory_schedules` tries again until the server answers.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.vault.clock import local_timezone_name
from schemas.config import KeelSettings
from schemas.vault.nightly import NightlyInput, NightlyJob
from schemas.vault.rollup import RollupKind
from schemas.vault.settings import CRON_VARIABLES, MemorySettings
from workflows.nightly import MemoryNightlyWorkflow

SCHEDULE_PREFIX = "keel-memory-"
# A server away: the schedules are tried again after these waits (doubling, then capped).
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0
# What a server that is away (or not yet up) answers; anything else will not pass by waiting.
TRANSIENT = frozenset({RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED,
                       RPCStatusCode.RESOURCE_EXHAUSTED})

log = logging.getLogger(__name__)


def schedule_id(settings: KeelSettings, name: str) -> str:
    """One install's schedule: installs sharing a namespace differ by their task queue."""
    return f"{SCHEDULE_PREFIX}{settings.task_queue}-{name}"


def _cron(memory: MemorySettings, name: str) -> str:
    return str(getattr(memory, f"{name}_cron"))


def memory_schedules(settings: KeelSettings) -> dict[str, Schedule]:
    """Schedule id -> schedule, for the four rollups and the doctor (`settings.memory`);
    each runs its job for every scope that has a vault."""
    memory = settings.memory
    policy = SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP,
                            catchup_window=memory.catchup_window)
    zone = memory.timezone or local_timezone_name()
    out: dict[str, Schedule] = {}
    for job in NightlyJob:
        out[schedule_id(settings, job.value)] = Schedule(
            action=ScheduleActionStartWorkflow(
                MemoryNightlyWorkflow.run, NightlyInput(job=job), id=f"keel-memory-{job.value}",
                task_queue=settings.vault_task_queue),
            spec=ScheduleSpec(cron_expressions=[_cron(memory, job.value)],
                              time_zone_name=zone),
            policy=policy)
    return out


class EnsuredSchedule(BaseModel):
    schedule_id: str
    created: bool  # False: it existed and was updated to the current settings


async def _ensure(client: Client, sid: str, schedule: Schedule) -> EnsuredSchedule:
    try:
        await client.create_schedule(sid, schedule)
        return EnsuredSchedule(schedule_id=sid, created=True)
    except ScheduleAlreadyRunningError:
        def replace(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=schedule)

        await client.get_schedule_handle(sid).update(replace)
        return EnsuredSchedule(schedule_id=sid, created=False)


async def ensure_memory_schedules(client: Client, settings: KeelSettings
                                  ) -> list[EnsuredSchedule]:
    """Create the five schedules, or bring existing ones in line with the settings."""
    return [await _ensure(client, sid, schedule)
            for sid, schedule in memory_schedules(settings).items()]


async def keep_memory_schedules(client: Client, settings: KeelSettings,
                                first_s: float = RETRY_FIRST_S) -> list[EnsuredSchedule]:
    """`ensure_memory_schedules`, each schedule tried again while Temporal is away; one it
    refuses for good (a cron spec it cannot read, a namespace that allows no schedules) is
    logged by its job and variable and left out, the others made: the worker serves
    sessions either way, and that job waits for a start that can make it."""
    schedules, out = memory_schedules(settings), []
    for job in NightlyJob:
        sid = schedule_id(settings, job.value)
        wait = first_s
        while True:
            try:
                out.append(await _ensure(client, sid, schedules[sid]))
                break
            except RPCError as err:
                if err.status not in TRANSIENT:
                    log.error("the memory schedule %s was refused (%s; its cron spec, %s, is "
                              "%r): that job will not run until a worker can create it",
                              job.value, err, CRON_VARIABLES[job.value],
                              _cron(settings.memory, job.value))
                    break
                log.warning("the memory schedules wait for Temporal (%s); trying again in "
                            "%.0f s", err, wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_MAX_S)
    return out


__all__ = ["RollupKind", "ensure_memory_schedules", "keep_memory_schedules",
           "memory_schedules"]
