"""Every activity option Keel's workflows use, named once.

A workflow calls `workflow.execute_activity_method(X.y, arg, **MODEL_CALL)`: each set says
how long one attempt may take, how long all attempts together may take, how often the
activity must beat, and how it is retried. A reader sees every end of every step here,
and a change of a timeout is one line.

Why the numbers:
- The model is slow and sometimes overloaded: ten minutes an attempt, half an hour in all,
  and a heartbeat so a dead worker is noticed in seconds, not at the attempt's end.
- The record is PostgreSQL: a retry soon, with a cap on the wait between tries.
- Every step a worker's death can catch mid-way beats (`HEARTBEAT`; the activity is
  `@beating`): Temporal sees the dead worker in seconds and another worker retries, where
  the attempt's start-to-close (30 s to record, 2 min a checkpoint step) held the turn.
- Long memory helps a turn but must never hold one up: three tries, then go on without.
- No step is a local activity. A plain turn's record and recall run inside its model call
  (activities.session, with their own bounds there), which saves the round trips a local
  activity was meant to; an ordinary activity is one the server ends when an attempt hangs
  (a database going down mid-connect was seen to hold a local attempt past every deadline,
  and with it the caller's answer), and work after the reply (the transcript) must not
  keep the reply's workflow task open, as a local activity would.
- A vault problem (`VaultError`: an unusable schema.json, a path outside the vault) needs a
  person, not another try.
- The vault has one writer: whatever touches it runs on the vault's own queue beside the
  workflow's (`on_vault_queue`, `tool_call`), which one worker serves (workers.worker).
- Every step ends: every set below has a maximum number of attempts or an overall deadline
  (`test_options.py` checks it), and a failure no retry can fix (bad data, a programming
  error: `NEVER_RETRY`) ends at its first attempt. What the session records when a step
  gives up is said in `workflows/inbox.py` (inputs) and `workflows/turn.py` (model calls,
  checkpoints).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.workflow import ActivityConfig, LocalActivityConfig

from schemas.config import vault_queue
from schemas.model import BEST_EFFORT_ATTEMPTS, CHECKPOINT_CALL_ATTEMPTS, MODEL_CALL_ATTEMPTS

# A worker that misses four beats is gone; the activity beats at a quarter of this
# (see activities.heartbeat.with_heartbeat, which reads it from activity.info()).
HEARTBEAT = timedelta(seconds=20)

# The exception class names (the failure's type) a retry cannot fix: a programming error,
# data the record or the model refuses, a payload that does not validate. PostgreSQL's own
# data errors arrive as their psycopg class names.
NEVER_RETRY = [
    "AttributeError", "TypeError", "NameError", "KeyError", "IndexError", "AssertionError",
    "NotImplementedError", "ValidationError", "UnicodeEncodeError", "UnicodeDecodeError",
    "RecursionError", "DataError", "UntranslatableCharacter", "CharacterNotInRepertoire",
    "InvalidTextRepresentation", "StringDataRightTruncation", "NumericValueOutOfRange",
    "NotNullViolation", "CheckViolation", "ForeignKeyViolation", "ProgrammingError",
    "UndefinedColumn", "UndefinedTable", "SyntaxError", "UnstorableData", "SeqAbandoned",
]

# A step of the record's (PostgreSQL, the workspace, a built-in tool): a ValueError there is
# bad data or a bug, which the step's ten minutes to an hour of retries never mend (a tool's
# input the code took wrong stood a turn still for all of them). Not for the model's calls:
# the SDK raises one for tool JSON the model wrote malformed, and says to ask again.
DB_NEVER_RETRY = [*NEVER_RETRY, "ValueError", "JSONDecodeError", "OverflowError",
                  "ZeroDivisionError"]
DB_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                       maximum_interval=timedelta(seconds=30),
                       non_retryable_error_types=DB_NEVER_RETRY)
MODEL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2), backoff_coefficient=2.0,
                          maximum_interval=timedelta(seconds=60),
                          maximum_attempts=MODEL_CALL_ATTEMPTS,
                          non_retryable_error_types=NEVER_RETRY)
CHECKPOINT_STEP_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                                    maximum_interval=timedelta(seconds=30), maximum_attempts=10,
                                   non_retryable_error_types=NEVER_RETRY)
CHECKPOINT_MODEL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2),
                                     maximum_interval=timedelta(seconds=60),
                                     maximum_attempts=CHECKPOINT_CALL_ATTEMPTS,
                                     non_retryable_error_types=NEVER_RETRY)
BEST_EFFORT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                                maximum_attempts=BEST_EFFORT_ATTEMPTS,
                                non_retryable_error_types=NEVER_RETRY)
VAULT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                          maximum_interval=timedelta(seconds=30), maximum_attempts=10,
                          non_retryable_error_types=["VaultError", *NEVER_RETRY])
VAULT_MODEL_RETRY = RetryPolicy(initial_interval=timedelta(seconds=5),
                                maximum_interval=timedelta(minutes=2), maximum_attempts=8,
                                non_retryable_error_types=["VaultError", *NEVER_RETRY])
DOCTOR_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                           maximum_interval=timedelta(seconds=10), maximum_attempts=3,
                           non_retryable_error_types=["VaultError", *NEVER_RETRY])
NOTIFY_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2), maximum_attempts=3,
                           non_retryable_error_types=NEVER_RETRY)

RECORD_ATTEMPT = timedelta(seconds=30)


def record_user_input(record_timeout_s: int) -> ActivityConfig:
    """A user's message: a caller is waiting, so give up in time and say so."""
    return ActivityConfig(start_to_close_timeout=RECORD_ATTEMPT,
                          schedule_to_close_timeout=timedelta(seconds=record_timeout_s),
                          heartbeat_timeout=HEARTBEAT, retry_policy=DB_RETRY)


# A background input has nobody waiting: it is retried for an hour (a database restart, a
# failover), then recorded as a notice saying what was lost. Later inputs wait for it
# (their seqs come after it), so it must end.
RECORD_BACKGROUND = ActivityConfig(start_to_close_timeout=RECORD_ATTEMPT,
                                   schedule_to_close_timeout=timedelta(hours=1),
                                   heartbeat_timeout=HEARTBEAT,
                                   retry_policy=DB_RETRY)
# The fence over a seq the session gave up on (a tombstone notice the late insert collides
# with): the seq stays unsettled until it is written, so no window reads past it.
# Inputs wait for it, so it is tried often.
RECORD_FENCE = ActivityConfig(start_to_close_timeout=RECORD_ATTEMPT,
                              schedule_to_close_timeout=timedelta(hours=1),
                              heartbeat_timeout=HEARTBEAT,
                              retry_policy=RetryPolicy(
                                  initial_interval=timedelta(seconds=1),
                                  maximum_interval=timedelta(seconds=5),
                                  non_retryable_error_types=NEVER_RETRY))
RECORD_NOTICE = ActivityConfig(start_to_close_timeout=RECORD_ATTEMPT,
                               schedule_to_close_timeout=timedelta(minutes=5),
                               heartbeat_timeout=HEARTBEAT,
                               retry_policy=DB_RETRY)
MODEL_CALL = ActivityConfig(start_to_close_timeout=timedelta(minutes=10),
                            schedule_to_close_timeout=timedelta(minutes=30),
                            heartbeat_timeout=HEARTBEAT, retry_policy=MODEL_RETRY)
# Stopping a model call: one row and a notification, quick or not at all (the call ends on
# its own either way). An ordinary activity, as every step is; sessions that interrupted
# before `workflows.interrupt.INTERRUPT_BY_ACTIVITY` ran it as a local activity, and replay so.
INTERRUPT_CALL = ActivityConfig(start_to_close_timeout=timedelta(seconds=10),
                                schedule_to_close_timeout=timedelta(seconds=30),
                                retry_policy=DB_RETRY)
INTERRUPT_LOCAL_CALL = LocalActivityConfig(
    start_to_close_timeout=INTERRUPT_CALL["start_to_close_timeout"],
    schedule_to_close_timeout=INTERRUPT_CALL["schedule_to_close_timeout"],
    retry_policy=DB_RETRY)
TOOL_CALL = ActivityConfig(start_to_close_timeout=timedelta(seconds=60),
                           schedule_to_close_timeout=timedelta(minutes=10),
                           heartbeat_timeout=HEARTBEAT, retry_policy=DB_RETRY)
CHECKPOINT_STEP = ActivityConfig(start_to_close_timeout=timedelta(minutes=2),
                                 schedule_to_close_timeout=timedelta(minutes=30),
                                 heartbeat_timeout=HEARTBEAT,
                                 retry_policy=CHECKPOINT_STEP_RETRY)
CHECKPOINT_ROUND = ActivityConfig(start_to_close_timeout=timedelta(minutes=10),
                                  schedule_to_close_timeout=timedelta(minutes=30),
                                  heartbeat_timeout=HEARTBEAT,
                                  retry_policy=CHECKPOINT_MODEL_RETRY)
# With the vault worker down, a turn goes on without memory after two minutes.
MEMORY_TURN = ActivityConfig(start_to_close_timeout=timedelta(seconds=30),
                             schedule_to_close_timeout=timedelta(minutes=2),
                             heartbeat_timeout=HEARTBEAT,
                             retry_policy=BEST_EFFORT_RETRY)
# The flush calls the model: it beats, so a worker that died mid-flush is noticed in
# seconds and the flush retried elsewhere, not after its five-minute attempt.
MEMORY_FLUSH = ActivityConfig(start_to_close_timeout=timedelta(minutes=5),
                              schedule_to_close_timeout=timedelta(minutes=15),
                              heartbeat_timeout=HEARTBEAT, retry_policy=BEST_EFFORT_RETRY)

ROLLUP_PERIODS = ActivityConfig(start_to_close_timeout=timedelta(minutes=2),
                                retry_policy=VAULT_RETRY)
ROLLUP_PLAN = ActivityConfig(start_to_close_timeout=timedelta(minutes=20),
                             schedule_to_close_timeout=timedelta(hours=2),
                             retry_policy=VAULT_MODEL_RETRY)
ROLLUP_APPLY = ActivityConfig(start_to_close_timeout=timedelta(minutes=10),
                              retry_policy=VAULT_RETRY)
VAULT_COMMIT = ActivityConfig(start_to_close_timeout=timedelta(minutes=6),
                              retry_policy=VAULT_RETRY)
DOCTOR_STEP = ActivityConfig(start_to_close_timeout=timedelta(minutes=10),
                             retry_policy=DOCTOR_RETRY)
DOCTOR_COMMIT = ActivityConfig(start_to_close_timeout=timedelta(minutes=6),
                               retry_policy=DOCTOR_RETRY)
NOTIFY = ActivityConfig(start_to_close_timeout=timedelta(minutes=1), retry_policy=NOTIFY_RETRY)
# Whether a child started ahead closed without answering (a describe): quick, or next time.
CHILD_CHECK = ActivityConfig(start_to_close_timeout=timedelta(seconds=10),
                             retry_policy=BEST_EFFORT_RETRY)


# Tools whose call writes the vault: their run_tool runs on the vault queue.
VAULT_TOOLS = frozenset({"write_card"})


def on_vault_queue(options: ActivityConfig) -> ActivityConfig:
    """`options` on the vault's queue beside this workflow's (schemas.config.vault_queue)."""
    return ActivityConfig(**options, task_queue=vault_queue(workflow.info().task_queue))


def tool_call(tool: str) -> ActivityConfig:
    """One tool call: on the session queue, or on the vault queue when it writes the vault."""
    return on_vault_queue(TOOL_CALL) if tool in VAULT_TOOLS else TOOL_CALL

# A session's own tools.
# A service tool or an MCP call may have side effects: a worker crash would make Temporal
# run it again, so each is tried once unless its declaration says otherwise. A service
# tool's timeouts come from its declaration; the schedule-to-close bound includes waiting
# for the service's worker, so a worker that is down fails the call clearly in time.

ONCE = RetryPolicy(maximum_attempts=1)
MCP_LIST_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=2,
                             non_retryable_error_types=["McpUnavailable"])
RECORD_TOOL_RESULT = ActivityConfig(start_to_close_timeout=RECORD_ATTEMPT,
                                    schedule_to_close_timeout=timedelta(minutes=10),
                                    heartbeat_timeout=HEARTBEAT,
                                    retry_policy=DB_RETRY)


def service_tool_options(task_queue: str, timeout_s: float, schedule_to_close_s: float,
                         max_attempts: int) -> ActivityConfig:
    """On the service's own queue (the tool's declaration names it)."""
    return ActivityConfig(
        task_queue=task_queue, start_to_close_timeout=timedelta(seconds=timeout_s),
        schedule_to_close_timeout=timedelta(seconds=max(schedule_to_close_s, timeout_s)),
        retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1),
                                 maximum_attempts=max_attempts))


def mcp_options(timeout_s: float, *, listing: bool = False) -> ActivityConfig:
    """`timeout_s` is the spec's own bound (McpServerSpec.activity_timeout_s)."""
    return ActivityConfig(start_to_close_timeout=timedelta(seconds=timeout_s),
                          schedule_to_close_timeout=timedelta(seconds=timeout_s * 3),
                          heartbeat_timeout=HEARTBEAT,
                          retry_policy=MCP_LIST_RETRY if listing else ONCE)


# A client's file calls, a tool result's whole text.
# A client waits on each: a few tries, then its update fails and says why. What the store
# refuses (a path, a size) is final at once.
FILE_CALL = ActivityConfig(start_to_close_timeout=timedelta(seconds=30),
                           schedule_to_close_timeout=timedelta(minutes=2),
                           retry_policy=RetryPolicy(
                               initial_interval=timedelta(seconds=1),
                               maximum_interval=timedelta(seconds=10), maximum_attempts=5,
                               non_retryable_error_types=["FileRefused", *NEVER_RETRY]))
