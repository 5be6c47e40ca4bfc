"""The doctor: nightly deterministic maintenance of the vault, no model.

enforce → decay → graph + health → MOC → dry-run scans → CORE.md size → re-index → commit.
A failing step is reported and the others still run. It notifies only when a person is
needed: a failed step, a health drop, CORE.md over its cap, a failed commit or push.

One run is one memory scope's (`DoctorInput.scope`), every step carrying it; the nightly
schedule starts `workflows.nightly`, which runs one of these per scope.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.vault.doctor import DoctorActivities, DoctorStepInput
    from activities.vault.rollup import CommitInput, NotifyInput, RollupActivities
    from schemas.vault.doctor import DoctorInput, DoctorReport, StepResult
    from schemas.vault.schema import GitResult
    from schemas.vault.scope import scope_note

from workflows.options import DOCTOR_COMMIT, DOCTOR_STEP, NOTIFY
from workflows.scheduled import scheduled_time

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
        as_of = scheduled_time(inp.as_of)
        report = DoctorReport(scope=inp.scope)
        step_input = DoctorStepInput(as_of=as_of, scope=inp.scope)
        for method in STEPS:
            name = method.__name__.removeprefix("doctor_")
            try:
                result: StepResult = await workflow.execute_activity_method(
                    method, step_input, **DOCTOR_STEP)
            except ActivityError as err:
                cause = err.cause
                why = getattr(cause, "message", None) or str(err)
                result = StepResult(step=name, ok=False, alert=True, summary=why)
            report.steps.append(result)
            if result.alert:
                report.alerts.append(f"{result.step}: {result.summary}")
        commit: GitResult = await workflow.execute_activity_method(
            RollupActivities.commit_vault,
            CommitInput(message="doctor: nightly maintenance", scope=inp.scope),
            **DOCTOR_COMMIT)
        report.commit = commit
        if commit.problem:
            report.alerts.append(f"commit: {commit.problem}")
        if commit.push_problem:
            report.alerts.append(f"push: {commit.push_problem}")
        if report.alerts:
            try:
                await workflow.execute_activity_method(
                    RollupActivities.notify,
                    NotifyInput(title=f"Keel doctor{scope_note(inp.scope)}", text=report.text(),
                                level="warning"),
                    **NOTIFY)
                report.notified = True
            except ActivityError:
                report.notified = False
        return report
