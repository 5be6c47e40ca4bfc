"""When a scheduled run was meant to happen: one rule for the rollups and the doctor.

Workflow code: it reads only the workflow's own info and clock, so it replays the same.
"""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow
from temporalio.common import SearchAttributeKey

SCHEDULED_START = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")


def scheduled_time(as_of: datetime | None) -> datetime:
    """When this run was meant to happen: the input's time, else the schedule's, else now.

    A run that a schedule starts late (catch-up after the worker was down) still closes the
    period of its scheduled time.
    """
    if as_of is not None:
        return as_of
    value = workflow.info().typed_search_attributes.get(SCHEDULED_START)
    return value or workflow.now()
