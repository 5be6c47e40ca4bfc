"""The nightly fan-out: one schedule per job (four rollups, the doctor) runs every scope.

Invariants: a scope is listed only when it has a vault; each scope runs as its own child
workflow (its own history, its own id), so one scope's failure never stops another's and
is named in the report. These models travel in Temporal histories: add fields only as
optional with defaults.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

NIGHTLY_WORKFLOW = "MemoryNightlyWorkflow"  # each job's run each night (workflows.nightly)


class NightlyJob(StrEnum):
    DAILY = "daily"
    WEEKLY = "weekly"
    MONTHLY = "monthly"
    YEARLY = "yearly"
    DOCTOR = "doctor"


def now_run_prefix(job: NightlyJob, scope: str) -> str:
    """How a job run now for one scope (`keel vault doctor`, `keel vault rollup`) is named,
    before its own 8 hex digits: the scope in its id, so an erasure finds its runs."""
    what = "doctor-now" if job == NightlyJob.DOCTOR else f"rollup-now-{job.value}"
    return f"keel-{what}-{scope}-"


def nightly_child_id(nightly_id: str, scope: str) -> str:
    """A nightly run's child for one scope (workflows.nightly)."""
    return f"{nightly_id}-{scope}"


class NightlyInput(BaseModel):
    job: NightlyJob
    as_of: datetime | None = None  # None: the schedule's time, else now
    notify: bool | None = None  # passed to each scope's rollup
    scopes: list[str] | None = None  # None: every scope that has a vault


class ScopeList(BaseModel):
    scopes: list[str]


class ScopeOutcome(BaseModel):
    scope: str
    ok: bool  # the scope's run finished and reported no failure or problem
    summary: str = ""  # its report's text, or why its run failed


class NightlyReport(BaseModel):
    job: NightlyJob
    outcomes: list[ScopeOutcome] = Field(default_factory=list)
    notified: bool = False

    @property
    def failed(self) -> list[str]:
        return [o.scope for o in self.outcomes if not o.ok]

    def text(self) -> str:
        lines = [f"Keel nightly {self.job.value}: {len(self.outcomes)} scope(s), "
                 f"{len(self.failed)} with a problem"]
        for o in self.outcomes:
            if not o.ok:
                lines.append(f"- {o.scope}: {o.summary}")
        return "\n".join(lines)
