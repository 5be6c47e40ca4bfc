"""The nightly fan-out: one workflow per job that runs that job for every memory scope.

One schedule per job (not one per scope): scopes appear whenever a new person's first
session writes to memory, and a schedule per scope would have to be created by whichever
activity made the vault, and removed with it. Here the list of scopes is read at run time
(every scope that has a vault), and each scope's run is its own child workflow: its own
history and id, its own retries, and a failure that ends at its boundary. A scope that
fails is named in the report and in one notification; the others run regardless.

Deterministic: the scope list comes from an activity, the children are awaited in scope
order, at most `PARALLEL_SCOPES` at a time.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from temporalio import workflow
from temporalio.exceptions import ActivityError, ChildWorkflowError, FailureError

with workflow.unsafe.imports_passed_through():
    from activities.vault.cards import ListScopesInput, VaultActivities
    from activities.vault.rollup import NotifyInput, RollupActivities
    from schemas.vault.doctor import DoctorInput, DoctorReport
    from schemas.vault.nightly import (
        NIGHTLY_WORKFLOW,
        NightlyInput,
        NightlyJob,
        NightlyReport,
        ScopeList,
        ScopeOutcome,
        nightly_child_id,
    )
    from schemas.vault.rollup import RollupInput, RollupKind, RollupReport

from workflows.doctor import DoctorWorkflow
from workflows.options import NOTIFY, ROLLUP_PERIODS
from workflows.rollup import ROLLUP_WORKFLOWS
from workflows.scheduled import scheduled_time

PARALLEL_SCOPES = 4


def _why(err: BaseException) -> str:
    cause: BaseException = err
    while isinstance(cause, FailureError) and cause.cause is not None:
        cause = cause.cause
    return str(getattr(cause, "message", None) or cause or err)


@workflow.defn(name=NIGHTLY_WORKFLOW)
class MemoryNightlyWorkflow:
    @workflow.run
    async def run(self, inp: NightlyInput) -> NightlyReport:
        as_of = scheduled_time(inp.as_of)
        if inp.scopes is None:
            listed: ScopeList = await workflow.execute_activity_method(
                VaultActivities.list_memory_scopes, ListScopesInput(), **ROLLUP_PERIODS)
            scopes = list(listed.scopes)
        else:
            scopes = list(inp.scopes)
        report = NightlyReport(job=inp.job)
        for i in range(0, len(scopes), PARALLEL_SCOPES):
            batch = scopes[i:i + PARALLEL_SCOPES]
            report.outcomes += await asyncio.gather(
                *(self._one(inp, scope, as_of) for scope in batch))
        if report.failed:
            try:
                await workflow.execute_activity_method(
                    RollupActivities.notify,
                    NotifyInput(title=f"Keel nightly {inp.job.value}", text=report.text(),
                                level="error"), **NOTIFY)
                report.notified = True
            except ActivityError:
                report.notified = False
        return report

    async def _one(self, inp: NightlyInput, scope: str, as_of: datetime) -> ScopeOutcome:
        child_id = nightly_child_id(workflow.info().workflow_id, scope)
        try:
            if inp.job == NightlyJob.DOCTOR:
                doctor: DoctorReport = await workflow.execute_child_workflow(
                    DoctorWorkflow.run, DoctorInput(as_of=as_of, scope=scope), id=child_id)
                return ScopeOutcome(scope=scope, ok=not doctor.alerts, summary=doctor.text())
            kind = RollupKind(inp.job.value)
            rollup: RollupReport = await workflow.execute_child_workflow(
                ROLLUP_WORKFLOWS[kind].run,
                RollupInput(kind=kind, as_of=as_of, notify=inp.notify, scope=scope),
                id=child_id)
            ok = not rollup.failures and not rollup.commit_problem
            return ScopeOutcome(scope=scope, ok=ok, summary=rollup.text())
        except ChildWorkflowError as err:
            return ScopeOutcome(scope=scope, ok=False, summary=f"run failed: {_why(err)}")
