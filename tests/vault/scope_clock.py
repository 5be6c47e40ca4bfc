"""A test-only clock for the time-skipping server: the nightly fan-out, day by day, as the
schedules would start it (the time-skipping server has no schedules)."""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from schemas.vault.nightly import NightlyInput, NightlyJob, NightlyReport

from workflows.nightly import MemoryNightlyWorkflow


class ScopeClockInput(BaseModel):
    first_run: datetime  # the first 04:00 (UTC)
    days: int


class ScopeClockResult(BaseModel):
    reports: list[NightlyReport]
    started: datetime
    finished: datetime


@workflow.defn(name="ScopeClockWorkflow")
class ScopeClockWorkflow:
    @workflow.run
    async def run(self, inp: ScopeClockInput) -> ScopeClockResult:
        started = workflow.now()
        reports: list[NightlyReport] = []
        for day in range(inp.days):
            at = inp.first_run + timedelta(days=day)
            await workflow.sleep(timedelta(days=1) if day else timedelta(seconds=1))
            jobs = [(NightlyJob.DAILY, timedelta(0))]
            if at.weekday() == 6:
                jobs.append((NightlyJob.WEEKLY, timedelta(minutes=15)))
            if day == inp.days - 1:
                jobs.append((NightlyJob.DOCTOR, timedelta(hours=1)))
            for job, offset in jobs:
                reports.append(await workflow.execute_child_workflow(
                    MemoryNightlyWorkflow.run, NightlyInput(job=job, as_of=at + offset),
                    id=f"{workflow.info().workflow_id}-{job.value}-{at.date()}"))
        return ScopeClockResult(reports=reports, started=started, finished=workflow.now())
