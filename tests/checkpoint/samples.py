"""The checkpoint texts the checkpoint tests share: a filled-in mind (`FILLED`) and a now
long enough to continue from (`NOW`)."""

from __future__ import annotations

from schemas.checkpoint.mind import TEMPLATE_HEADINGS


def _guidance(name: str) -> str:
    return next(h.guidance or "" for h in TEMPLATE_HEADINGS if h.text == name)


FILLED = f"""\
# Mind

## Where I stand
{_guidance("Where I stand")}
I review Ana's pull requests for the billing service. I interrupt her only when one
needs her decision.

## Goals
{_guidance("Goals")}

### Mission
{_guidance("Mission")}
- Work through the PR queue oldest first
- Keep the billing tests green
  on every branch

### Workstreams
{_guidance("Workstreams")}
- PR queue: 3 of 12 reviewed; next #482

## Key decisions
{_guidance("Key decisions")}
- Use squash merges: Ana asked for a linear history.

## Lessons
{_guidance("Lessons")}
- Run the migration check before approving schema changes.
"""


NOW = (
    "Current step: reviewing PR #482 (workstream: PR queue). Done: #479-#481. In progress: "
    "#482, the migration check. Waiting on: background command bg-7 (pytest). Next: the user "
    'said "oldest first", so #483 after this. Pitfall: `ERROR: relation "invoices" does not '
    "exist` when the migration is skipped. References: services/billing/migrations/0042.py."
)
