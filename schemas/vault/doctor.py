"""The doctor's results: each step's, the run's input and its report.

These travel in Temporal histories: add fields only as optional with defaults.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from schemas.vault.schema import GitResult
from schemas.vault.scope import DEFAULT_SCOPE


class StepResult(BaseModel):
    step: str
    ok: bool = True
    summary: str = ""
    details: list[str] = Field(default_factory=list)
    alert: bool = False  # a person is needed
    data: dict[str, Any] = Field(default_factory=dict)


class DoctorInput(BaseModel):
    as_of: datetime | None = None  # None: the schedule's time, else now
    scope: str = DEFAULT_SCOPE  # whose vault (the nightly fan-out gives one scope per run)


class DoctorReport(BaseModel):
    scope: str = DEFAULT_SCOPE
    steps: list[StepResult] = Field(default_factory=list)
    commit: GitResult | None = None
    alerts: list[str] = Field(default_factory=list)
    notified: bool = False

    def text(self) -> str:
        lines = ["Keel doctor: a person is needed" if self.alerts else "Keel doctor: all well"]
        lines += [f"- {a}" for a in self.alerts]
        lines.append("Steps:")
        for s in self.steps:
            lines.append(f"- {s.step}: {'ok' if s.ok else 'FAILED'}: {s.summary}")
            if s.alert:
                lines.extend(f"  - {d}" for d in s.details[:10])
        if self.commit is not None:
            lines.extend(f"- commit: {note}" for note in self.commit.notes)
        return "\n".join(lines)
