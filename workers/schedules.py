"""The five Temporal Schedules of long memory: four rollups and the doctor.

Client code, run by the worker process at start-up. Cron specs run in the configured time
zone (server-local by default). A run missed while
the worker was down starts when it returns, within the catch-up window; a run still going
when the next is due makes that one skip, never overlap.
"""

from __future__ import annotations

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

from activities.vault.clock import local_timezone_name
from schemas.config import KeelSettings
from schemas.vault.doctor import DoctorInput
from schemas.vault.rollup import RollupInput, RollupKind
from schemas.vault.settings import MemorySettings
from workflows.doctor import DoctorWorkflow
from workflows.rollup import ROLLUP_WORKFLOWS

SCHEDULE_PREFIX = "keel-memory-"


def schedule_id(settings: KeelSettings, name: str) -> str:
    """One install's schedule: installs sharing a namespace differ by their task queue."""
    return f"{SCHEDULE_PREFIX}{settings.task_queue}-{name}"


def _cron(memory: MemorySettings, name: str) -> str:
    return str(getattr(memory, f"{name}_cron"))


def memory_schedules(settings: KeelSettings) -> dict[str, Schedule]:
    """Schedule id -> schedule, for the four rollups and the doctor (`settings.memory`)."""
    memory = settings.memory
    policy = SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP,
                            catchup_window=memory.catchup_window)
    zone = memory.timezone or local_timezone_name()
    out: dict[str, Schedule] = {}
    for kind, wf in ROLLUP_WORKFLOWS.items():
        out[schedule_id(settings, kind.value)] = Schedule(
            action=ScheduleActionStartWorkflow(
                wf.run, RollupInput(kind=kind), id=f"keel-rollup-{kind.value}",
                task_queue=settings.vault_task_queue),
            spec=ScheduleSpec(cron_expressions=[_cron(memory, kind.value)],
                              time_zone_name=zone),
            policy=policy)
    out[schedule_id(settings, "doctor")] = Schedule(
        action=ScheduleActionStartWorkflow(
            DoctorWorkflow.run, DoctorInput(), id="keel-doctor",
            task_queue=settings.vault_task_queue),
        spec=ScheduleSpec(cron_expressions=[memory.doctor_cron], time_zone_name=zone),
        policy=policy)
    return out


class EnsuredSchedule(BaseModel):
    schedule_id: str
    created: bool  # False: it existed and was updated to the current settings


async def ensure_memory_schedules(client: Client, settings: KeelSettings
                                  ) -> list[EnsuredSchedule]:
    """Create the five schedules, or bring existing ones in line with the settings."""
    out: list[EnsuredSchedule] = []
    for sid, schedule in memory_schedules(settings).items():
        try:
            await client.create_schedule(sid, schedule)
            out.append(EnsuredSchedule(schedule_id=sid, created=True))
        except ScheduleAlreadyRunningError:
            def replace(_: ScheduleUpdateInput, new: Schedule = schedule) -> ScheduleUpdate:
                return ScheduleUpdate(schedule=new)

            await client.get_schedule_handle(sid).update(replace)
            out.append(EnsuredSchedule(schedule_id=sid, created=False))
    return out


__all__ = ["RollupKind", "ensure_memory_schedules", "memory_schedules"]
