"""The nightly rollups: daily → weekly → monthly → yearly, one workflow per kind.

Each run works out which periods are due (the one its schedule closes, plus any a stopped
worker missed), then for each: plan (the model call, stored) and apply (ledgered card
writes, the summary, CORE.md). A crash at any point resumes without a second model call
or a second card write. Daily and weekly runs report through the notification hook; what
their model requests cost, as the API counted it, is in the report and on the metrics.

One run is one memory scope's (`RollupInput.scope`): every activity it calls carries that
scope, so it reads, summarises and writes that scope's vault only. The nightly schedules
start `workflows.nightly`, which runs one of these per scope.
"""

from __future__ import annotations

from typing import Protocol

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.vault.rollup import (
        CommitInput,
        NotifyInput,
        RollupActivities,
        RollupPeriodsInput,
        RollupStepInput,
    )
    from schemas.vault.rollup import RollupInput, RollupKind, RollupReport, rollup_notifies
    from schemas.vault.schema import GitResult
    from schemas.vault.scope import scope_note

from workflows.metrics import count_spend
from workflows.options import NOTIFY, ROLLUP_APPLY, ROLLUP_PERIODS, ROLLUP_PLAN, VAULT_COMMIT
from workflows.scheduled import scheduled_time


def _failure(err: ActivityError) -> str:
    cause = err.cause
    return str(cause.message if cause is not None and hasattr(cause, "message") else err)


async def run_rollup(kind: RollupKind, inp: RollupInput) -> RollupReport:
    as_of = scheduled_time(inp.as_of)
    due = await workflow.execute_activity_method(
        RollupActivities.plan_rollup_periods,
        RollupPeriodsInput(kind=kind, as_of=as_of, scope=inp.scope), **ROLLUP_PERIODS)
    report = RollupReport(kind=kind, skipped=due.skipped, scope=inp.scope)
    for period in due.periods:
        step = RollupStepInput(kind=kind, period=period, scope=inp.scope)
        try:
            planned = await workflow.execute_activity_method(
                RollupActivities.plan_rollup, step, **ROLLUP_PLAN)
            report.spent = report.spent.plus(planned.spent)
            count_spend(planned.spent, "rollup")
            result = await workflow.execute_activity_method(
                RollupActivities.apply_rollup, step, **ROLLUP_APPLY)
        except ActivityError as err:
            report.failures[period] = _failure(err)
            continue
        report.periods.append(period)
        report.results[period] = result
    if report.periods:
        commit: GitResult = await workflow.execute_activity_method(
            RollupActivities.commit_vault,
            CommitInput(message=f"rollup {kind.value}: {', '.join(report.periods)}",
                        scope=inp.scope),
            **VAULT_COMMIT)
        report.committed = commit.committed
        report.commit_problem = commit.problem or commit.push_problem
    wants = rollup_notifies(kind, inp.notify)
    if (wants and report.periods) or report.failures:
        try:
            await workflow.execute_activity_method(
                RollupActivities.notify,
                NotifyInput(title=f"Keel {kind.value} rollup{scope_note(inp.scope)}",
                            text=report.text(),
                            level="error" if report.failures else "info"),
                **NOTIFY)
            report.notified = True
        except ActivityError:
            report.notified = False
    return report


@workflow.defn(name="DailyRollupWorkflow")
class DailyRollupWorkflow:
    @workflow.run
    async def run(self, inp: RollupInput) -> RollupReport:
        return await run_rollup(RollupKind.DAILY, inp)


@workflow.defn(name="WeeklyRollupWorkflow")
class WeeklyRollupWorkflow:
    @workflow.run
    async def run(self, inp: RollupInput) -> RollupReport:
        return await run_rollup(RollupKind.WEEKLY, inp)


@workflow.defn(name="MonthlyRollupWorkflow")
class MonthlyRollupWorkflow:
    @workflow.run
    async def run(self, inp: RollupInput) -> RollupReport:
        return await run_rollup(RollupKind.MONTHLY, inp)


@workflow.defn(name="YearlyRollupWorkflow")
class YearlyRollupWorkflow:
    @workflow.run
    async def run(self, inp: RollupInput) -> RollupReport:
        return await run_rollup(RollupKind.YEARLY, inp)


class RollupWorkflow(Protocol):
    """What every rollup workflow is: one run over a `RollupInput`."""

    async def run(self, inp: RollupInput) -> RollupReport: ...


ROLLUP_WORKFLOWS: dict[RollupKind, type[RollupWorkflow]] = {
    RollupKind.DAILY: DailyRollupWorkflow,
    RollupKind.WEEKLY: WeeklyRollupWorkflow,
    RollupKind.MONTHLY: MonthlyRollupWorkflow,
    RollupKind.YEARLY: YearlyRollupWorkflow,
}
