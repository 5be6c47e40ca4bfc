"""A test-only clock for the time-skipping server: the nightly schedule, day by day.

Real Temporal Schedules start these workflows in production (and are tested on the dev
server); the time-skipping test server has no schedules, so this workflow sleeps to each
04:00 and starts the same workflows the schedules would, with the same scheduled times.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from schemas.vault.rollup import RollupInput, RollupKind, RollupReport

from schemas.vault.doctor import DoctorInput
from workflows.doctor import DoctorWorkflow
from workflows.rollup import (
    DailyRollupWorkflow,
    MonthlyRollupWorkflow,
    RollupWorkflow,
    WeeklyRollupWorkflow,
    YearlyRollupWorkflow,
)


class ClockInput(BaseModel):
    first_run: datetime  # the first 04:00 (UTC)
    days: int
    doctor_every: int = 7


class ClockResult(BaseModel):
    reports: list[RollupReport]
    doctor_runs: int
    started: datetime
    finished: datetime


@workflow.defn(name="MemoryClockWorkflow")
class MemoryClockWorkflow:
    @workflow.run
    async def run(self, inp: ClockInput) -> ClockResult:
        started = workflow.now()
        reports: list[RollupReport] = []
        doctor_runs = 0
        for day in range(inp.days):
            at = inp.first_run + timedelta(days=day)
            # A day of simulated time passes in a moment on the time-skipping server.
            await workflow.sleep(timedelta(days=1) if day else timedelta(seconds=1))
            runs: list[tuple[type[RollupWorkflow], RollupKind, timedelta]] = [
                (DailyRollupWorkflow, RollupKind.DAILY, timedelta(0))]
            if at.weekday() == 6:
                runs.append((WeeklyRollupWorkflow, RollupKind.WEEKLY, timedelta(minutes=15)))
            if at.day == 1:
                runs.append((MonthlyRollupWorkflow, RollupKind.MONTHLY, timedelta(minutes=20)))
            if at.day == 1 and at.month == 1:
                runs.append((YearlyRollupWorkflow, RollupKind.YEARLY, timedelta(minutes=25)))
            for wf, kind, offset in runs:
                report = await workflow.execute_child_workflow(
                    wf.run, RollupInput(kind=kind, as_of=at + offset),
                    id=f"{workflow.info().workflow_id}-{kind.value}-{at.date()}")
                reports.append(report)
            if inp.doctor_every and day % inp.doctor_every == inp.doctor_every - 1:
                await workflow.execute_child_workflow(
                    DoctorWorkflow.run, DoctorInput(as_of=at + timedelta(hours=1)),
                    id=f"{workflow.info().workflow_id}-doctor-{at.date()}")
                doctor_runs += 1
        return ClockResult(reports=reports, doctor_runs=doctor_runs, started=started,
                           finished=workflow.now())
