"""Every activity option Keel's workflows use, named once.

A workflow calls `workflow.execute_activity_method(X.y, arg, **MODEL_CALL)`: each set says
how long one attempt may take, how long all attempts together may take, how often the
activity must beat, and how it is retried. A reader sees every end of every step here,
and a change of a timeout is one line.

Why the numbers:
- The model is slow and sometimes overloaded: ten minutes an attempt, half an hour in all,
  and a heartbeat so a dead worker is noticed in seconds, not at the attempt's end.
- The record is PostgreSQL: a retry soon, with a cap on the wait between tries.
- Long memory helps a turn but must never hold one up: three tries, then go on without.
- A vault problem (`VaultError`: an unusable schema.json, a path outside the vault) needs a
  person, not another try.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TypedDict

from temporalio.common import RetryPolicy


class ActivityOptions(TypedDict, total=False):
    """The keyword arguments of `workflow.execute_activity_method` that Keel sets."""

    start_to_close_timeout: timedelta
    schedule_to_close_timeout: timedelta | None
    heartbeat_timeout: timedelta | None
    retry_policy: RetryPolicy


# A worker that misses four beats is gone; the activity beats at a quarter of this
# (see activities.model.with_heartbeat, which reads it from activity.info()).
HEARTBEAT = timedelta(seconds=20)

DB_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                       maximum_interval=timedelta(seconds=30))
MODEL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2), backoff_coefficient=2.0,
                          maximum_interval=timedelta(seconds=60))
CHECKPOINT_STEP_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                                    maximum_interval=timedelta(seconds=30), maximum_attempts=10)
CHECKPOINT_MODEL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2),
                                     maximum_interval=timedelta(seconds=60), maximum_attempts=8)
BEST_EFFORT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3)
VAULT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                          maximum_interval=timedelta(seconds=30), maximum_attempts=10,
                          non_retryable_error_types=["VaultError"])
VAULT_MODEL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=5),
                                maximum_interval=timedelta(minutes=2), maximum_attempts=8,
                                non_retryable_error_types=["VaultError"])
DOCTOR_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                           maximum_interval=timedelta(seconds=10), maximum_attempts=3,
                           non_retryable_error_types=["VaultError"])
NOTIFY_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2), maximum_attempts=3)

RECORD_ATTEMPT = timedelta(seconds=30)


def record_user_input(record_timeout_s: int) -> ActivityOptions:
    """A user's message: a caller is waiting, so give up in time and say so."""
    return ActivityOptions(start_to_close_timeout=RECORD_ATTEMPT,
                           schedule_to_close_timeout=timedelta(seconds=record_timeout_s),
                           retry_policy=DB_RETRY)


# A background input has nobody waiting and must not be lost: no overall deadline.
RECORD_BACKGROUND = ActivityOptions(start_to_close_timeout=RECORD_ATTEMPT,
                                    schedule_to_close_timeout=None, retry_policy=DB_RETRY)
RECORD_NOTICE = ActivityOptions(start_to_close_timeout=RECORD_ATTEMPT,
                                schedule_to_close_timeout=timedelta(minutes=5),
                                retry_policy=DB_RETRY)
MODEL_CALL = ActivityOptions(start_to_close_timeout=timedelta(minutes=10),
                             schedule_to_close_timeout=timedelta(minutes=30),
                             heartbeat_timeout=HEARTBEAT, retry_policy=MODEL_RETRY)
TOOL_CALL = ActivityOptions(start_to_close_timeout=timedelta(seconds=60),
                            retry_policy=DB_RETRY)
CHECKPOINT_STEP = ActivityOptions(start_to_close_timeout=timedelta(minutes=2),
                                  schedule_to_close_timeout=timedelta(minutes=30),
                                  retry_policy=CHECKPOINT_STEP_RETRY)
CHECKPOINT_ROUND = ActivityOptions(start_to_close_timeout=timedelta(minutes=10),
                                   schedule_to_close_timeout=timedelta(minutes=30),
                                   heartbeat_timeout=HEARTBEAT,
                                   retry_policy=CHECKPOINT_MODEL_RETRY)
MEMORY_TURN = ActivityOptions(start_to_close_timeout=timedelta(seconds=30),
                              retry_policy=BEST_EFFORT_RETRY)
MEMORY_FLUSH = ActivityOptions(start_to_close_timeout=timedelta(minutes=5),
                               retry_policy=BEST_EFFORT_RETRY)

ROLLUP_PERIODS = ActivityOptions(start_to_close_timeout=timedelta(minutes=2),
                                 retry_policy=VAULT_RETRY)
ROLLUP_PLAN = ActivityOptions(start_to_close_timeout=timedelta(minutes=20),
                              schedule_to_close_timeout=timedelta(hours=2),
                              retry_policy=VAULT_MODEL_RETRY)
ROLLUP_APPLY = ActivityOptions(start_to_close_timeout=timedelta(minutes=10),
                               retry_policy=VAULT_RETRY)
VAULT_COMMIT = ActivityOptions(start_to_close_timeout=timedelta(minutes=6),
                               retry_policy=VAULT_RETRY)
DOCTOR_STEP = ActivityOptions(start_to_close_timeout=timedelta(minutes=10),
                              retry_policy=DOCTOR_RETRY)
DOCTOR_COMMIT = ActivityOptions(start_to_close_timeout=timedelta(minutes=6),
                                retry_policy=DOCTOR_RETRY)
NOTIFY = ActivityOptions(start_to_close_timeout=timedelta(minutes=1), retry_policy=NOTIFY_RETRY)


# ----- issue 8: a session's own tools -------------------------------------------------
# A service tool or an MCP call may have side effects: a worker crash would make Temporal
# run it again, so each is tried once unless its declaration says otherwise. A service
# tool's timeouts come from its declaration; the schedule-to-close bound includes waiting
# for the service's worker, so a worker that is down fails the call clearly in time.

ONCE = RetryPolicy(maximum_attempts=1)
MCP_LIST_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=2,
                             non_retryable_error_types=["McpUnavailable"])
RECORD_TOOL_RESULT = ActivityOptions(start_to_close_timeout=RECORD_ATTEMPT,
                                     schedule_to_close_timeout=timedelta(minutes=10),
                                     retry_policy=DB_RETRY)


def service_tool_options(timeout_s: float, schedule_to_close_s: float,
                         max_attempts: int) -> ActivityOptions:
    return ActivityOptions(
        start_to_close_timeout=timedelta(seconds=timeout_s),
        schedule_to_close_timeout=timedelta(seconds=max(schedule_to_close_s, timeout_s)),
        retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1),
                                 maximum_attempts=max_attempts))


def mcp_options(timeout_s: float, *, listing: bool = False) -> ActivityOptions:
    """`timeout_s` is the spec's own bound (McpServerSpec.activity_timeout_s)."""
    return ActivityOptions(start_to_close_timeout=timedelta(seconds=timeout_s),
                           schedule_to_close_timeout=timedelta(seconds=timeout_s * 3),
                           heartbeat_timeout=HEARTBEAT,
                           retry_policy=MCP_LIST_RETRY if listing else ONCE)
