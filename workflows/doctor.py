"""The doctor: nightly deterministic maintenance of the vault, no model.

enforce → decay → graph + health → MOC → dry-run scans → CORE.md size → re-index → commit.
A failing step is reported and the others still run. It notifies only when a person is
needed: a failed step, a health drop, CORE.md over its cap, a failed commit or push.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.vault_doctor import DoctorActivities
    from activities.vault_rollup import RollupActivities
    from schemas.vault import CommitInput, GitResult, NotifyInput
    from schemas.vault_doctor import DoctorInput, DoctorReport, DoctorStepInput, StepResult

SCHEDULED_START = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")
# A vault problem (VaultError) needs a person, not another try.
STEP_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                         maximum_interval=timedelta(seconds=10), maximum_attempts=3,
                         non_retryable_error_types=["VaultError"])


STEPS = [
    DoctorActivities.doctor_enforce,
    DoctorActivities.doctor_decay,
    DoctorActivities.doctor_graph,
    DoctorActivities.doctor_moc,
    DoctorActivities.doctor_scans,
    DoctorActivities.doctor_core_check,
    DoctorActivities.doctor_reindex,
]


@workflow.defn(name="DoctorWorkflow")
class DoctorWorkflow:
    @workflow.run
    async def run(self, inp: DoctorInput) -> DoctorReport:
        as_of = inp.as_of or workflow.info().typed_search_attributes.get(
            SCHEDULED_START) or workflow.now()
        report = DoctorReport()
        step_input = DoctorStepInput(as_of=as_of)
        for method in STEPS:
            name = method.__name__.removeprefix("doctor_")
            try:
                result: StepResult = await workflow.execute_activity_method(
                    method, step_input, start_to_close_timeout=timedelta(minutes=10),
                    retry_policy=STEP_RETRY)
            except ActivityError as err:
                cause = err.cause
                why = getattr(cause, "message", None) or str(err)
                result = StepResult(step=name, ok=False, alert=True, summary=why)
            report.steps.append(result)
            if result.alert:
                report.alerts.append(f"{result.step}: {result.summary}")
        commit: GitResult = await workflow.execute_activity_method(
            RollupActivities.commit_vault, CommitInput(message="doctor: nightly maintenance"),
            start_to_close_timeout=timedelta(minutes=6), retry_policy=STEP_RETRY)
        report.commit = commit
        if commit.problem:
            report.alerts.append(f"commit: {commit.problem}")
        if commit.push_problem:
            report.alerts.append(f"push: {commit.push_problem}")
        if report.alerts:
            try:
                await workflow.execute_activity_method(
                    RollupActivities.notify,
                    NotifyInput(title="Keel doctor", text=report.text(), level="warning"),
                    start_to_close_timeout=timedelta(minutes=1),
                    retry_policy=RetryPolicy(maximum_attempts=3))
                report.notified = True
            except ActivityError:
                report.notified = False
        return report
