"""Whether a worker serves a task queue: the one place Keel's client reads a queue's pollers.

Invariant: a queue counts as served when a worker polled it within `fresh_s` seconds, as
DescribeTaskQueue reports its pollers (a poll is held up to a minute, so a live worker has
polled within about that); a poller without a time counts as fresh. A describe the server
cancels (seen just after a worker polling the queue was killed mid-poll) is asked again.
With `grace_s`, a queue with no poller is asked again until then: a worker started a moment
ago (`keel dev` in a script, a deploy) has its first poll on the way, and the server lists
it only once that poll arrives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import PollerInfo, TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

__all__ = ["POLLER_FRESH_S", "polled_recently", "pollers"]

POLLER_FRESH_S = 90  # a worker's long poll lasts up to 70 s; a live one polled within this
GRACE_STEP_S = 0.25  # how often a queue with no poller is asked again within a grace


async def polled_recently(client: Client, queue: str, *, activities: bool = False,
                          fresh_s: float = POLLER_FRESH_S, grace_s: float = 0.0) -> bool:
    """Whether a worker polled `queue` (its workflow tasks, or with `activities` its
    activity tasks) in the last `fresh_s` seconds (or, with `grace_s`, does within it)."""
    deadline = time.monotonic() + grace_s
    while True:
        now = time.time()
        if any(not p.HasField("last_access_time")
               or now - p.last_access_time.ToSeconds() < fresh_s
               for p in await pollers(client, queue, activities=activities)):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(GRACE_STEP_S)


async def pollers(client: Client, queue: str, *, activities: bool = False,
                  tries: int = 5) -> Sequence[PollerInfo]:
    """The pollers DescribeTaskQueue reports for `queue`'s workflow (or activity) tasks. The
    dev server has answered CANCELLED ("operation was canceled") right after a worker
    polling the queue was SIGKILLed; that is asked again, `tries` times in all."""
    kind = (TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY if activities
            else TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)
    request = DescribeTaskQueueRequest(namespace=client.namespace,
                                       task_queue=TaskQueue(name=queue), task_queue_type=kind)
    for attempt in range(1, tries):
        try:
            return (await client.workflow_service.describe_task_queue(request)).pollers
        except RPCError as err:
            if err.status != RPCStatusCode.CANCELLED:
                raise
        await asyncio.sleep(0.2 * attempt)
    return (await client.workflow_service.describe_task_queue(request)).pollers
