"""Whether a worker serves a queue (keel._queues): a worker started a moment after the
question is waited for, within the grace asked; none is said once the grace is over. A real
Temporal dev server and a real worker."""

from __future__ import annotations

import asyncio
import time
import uuid

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from keel._queues import polled_recently


@activity.defn
async def idle() -> None:
    """An activity for the worker to serve; never called."""


async def test_a_worker_starting_within_the_grace_serves_the_queue(client: Client) -> None:
    """`keel vault forget` right after `keel dev` started was refused with "no vault
    worker: none polled ... lately" (seen in CI): the worker's first poll was on its way."""
    queue = f"q-{uuid.uuid4().hex[:8]}"
    asked = asyncio.create_task(polled_recently(client, queue, activities=True, grace_s=8.0))
    await asyncio.sleep(0.5)
    assert not asked.done()
    async with Worker(client, task_queue=queue, activities=[idle]):
        assert await asked


async def test_no_worker_is_said_once_the_grace_is_over(client: Client) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    assert not await polled_recently(client, queue, activities=True)  # no grace: at once
    started = time.monotonic()
    assert not await polled_recently(client, queue, activities=True, grace_s=1.0)
    assert 1.0 <= time.monotonic() - started < 5.0
