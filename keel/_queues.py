"""Whether a worker serves a task queue: the one place Keel's client reads a queue's pollers.

Invariant: a queue counts as served when a worker polled it within `fresh_s` seconds, as
DescribeTaskQueue reports its pollers (a poll is held up to a minute, so a live worker has
polled within about that); a poller without a time counts as fresh.
"""

from __future__ import annotations

import time

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

__all__ = ["POLLER_FRESH_S", "polled_recently"]

POLLER_FRESH_S = 90  # a worker's long poll lasts up to 70 s; a live one polled within this


async def polled_recently(client: Client, queue: str, *, activities: bool = False,
                          fresh_s: float = POLLER_FRESH_S) -> bool:
    """Whether a worker polled `queue` (its workflow tasks, or with `activities` its
    activity tasks) in the last `fresh_s` seconds."""
    kind = (TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY if activities
            else TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)
    described = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(namespace=client.namespace, task_queue=TaskQueue(name=queue),
                                 task_queue_type=kind))
    now = time.time()
    return any(not p.HasField("last_access_time")
               or now - p.last_access_time.ToSeconds() < fresh_s for p in described.pollers)
