"""The nightly rollups: daily → weekly → monthly → yearly, one workflow per kind.

Each run works out which periods are due (the one its schedule closes, plus any a stopped
worker missed), then for each: plan (the model call, stored) and apply (ledgered card
writes, the summary, CORE.md). A crash at any point resumes without a second model call
or a second card write. Daily and weekly runs report through the notification hook.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.vault_rollup import RollupActivities
    from schemas.vault import CommitInput, GitResult, NotifyInput
    from schemas.vault_rollup import (
        RollupInput,
        RollupKind,
        RollupPeriodsInput,
        RollupReport,
        RollupStepInput,
        rollup_notifies,
    )

from workflows.doctor import DoctorWorkflow

SCHEDULED_START = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")
# A vault problem (VaultError: unusable schema.json, a path outside the vault) needs a
# person, not another try.
FILE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                         maximum_interval=timedelta(seconds=30), maximum_attempts=10,
                         non_retryable_error_types=["VaultError"])
MODEL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=5),
                          maximum_interval=timedelta(minutes=2), maximum_attempts=8,
                          non_retryable_error_types=["VaultError"])
NOTIFY_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2), maximum_attempts=3)


def scheduled_time(as_of: datetime | None) -> datetime:
    """When this run was meant to happen: the input's time, else the schedule's, else now.

    A run that a schedule starts late (catch-up after the worker was down) still closes the
    period of its scheduled time.
    """
    if as_of is not None:
        return as_of
    value = workflow.info().typed_search_attributes.get(SCHEDULED_START)
    return value or workflow.now()


def _failure(err: ActivityError) -> str:
    cause = err.cause
    return str(cause.message if cause is not None and hasattr(cause, "message") else err)


async def run_rollup(kind: RollupKind, inp: RollupInput) -> RollupReport:
    as_of = scheduled_time(inp.as_of)
    due = await workflow.execute_activity_method(
        RollupActivities.plan_rollup_periods, RollupPeriodsInput(kind=kind, as_of=as_of),
        start_to_close_timeout=timedelta(minutes=2), retry_policy=FILE_RETRY)
    report = RollupReport(kind=kind, skipped=due.skipped)
    for period in due.periods:
        step = RollupStepInput(kind=kind, period=period)
        try:
            await workflow.execute_activity_method(
                RollupActivities.plan_rollup, step,
                start_to_close_timeout=timedelta(minutes=20),
                schedule_to_close_timeout=timedelta(hours=2), retry_policy=MODEL_RETRY)
            result = await workflow.execute_activity_method(
                RollupActivities.apply_rollup, step,
                start_to_close_timeout=timedelta(minutes=10), retry_policy=FILE_RETRY)
        except ActivityError as err:
            report.failures[period] = _failure(err)
            continue
        report.periods.append(period)
        report.results[period] = result
    if report.periods:
        commit: GitResult = await workflow.execute_activity_method(
            RollupActivities.commit_vault,
            CommitInput(message=f"rollup {kind.value}: {', '.join(report.periods)}"),
            start_to_close_timeout=timedelta(minutes=6), retry_policy=FILE_RETRY)
        report.committed = commit.committed
        report.commit_problem = commit.problem or commit.push_problem
    wants = rollup_notifies(kind, inp.notify)
    if (wants and report.periods) or report.failures:
        try:
            await workflow.execute_activity_method(
                RollupActivities.notify,
                NotifyInput(title=f"Keel {kind.value} rollup", text=report.text(),
                            level="error" if report.failures else "info"),
                start_to_close_timeout=timedelta(minutes=1), retry_policy=NOTIFY_RETRY)
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


ROLLUP_WORKFLOWS: dict[RollupKind, type] = {
    RollupKind.DAILY: DailyRollupWorkflow,
    RollupKind.WEEKLY: WeeklyRollupWorkflow,
    RollupKind.MONTHLY: MonthlyRollupWorkflow,
    RollupKind.YEARLY: YearlyRollupWorkflow,
}

# Everything long memory runs, for one worker registration.
MEMORY_WORKFLOWS: list[type] = [*ROLLUP_WORKFLOWS.values(), DoctorWorkflow]
