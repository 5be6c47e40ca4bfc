"""Build and run a Keel worker: the session workflow, the checkpoint chain, long memory."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

from temporalio.client import Client
from temporalio.worker import Interceptor, Worker

from activities.checkpoint import CheckpointActivities
from activities.session import SessionActivities
from schemas.config import KeelSettings
from schemas.tokens import count_tokens
from workflows.session import SessionWorkflow


def _memory_parts(settings: KeelSettings) -> tuple[list[type], list[Callable[..., Any]]]:
    try:
        from activities.vault import memory_activities
        from workflows.rollup import MEMORY_WORKFLOWS
    except ImportError:
        return [], []
    return list(MEMORY_WORKFLOWS), list(memory_activities(settings))


def session_activities(settings: KeelSettings) -> list[Callable[..., Any]]:
    session = SessionActivities(settings)
    checkpoint = CheckpointActivities(settings)
    return [
        session.record_input, session.call_model, session.run_tool,
        checkpoint.prepare_checkpoint, checkpoint.checkpoint_round,
        checkpoint.validate_checkpoint, checkpoint.store_checkpoint,
        checkpoint.move_earliest_half,
    ]


def build_worker(client: Client, settings: KeelSettings,
                 interceptors: Sequence[Interceptor] = (),
                 activity_executor: concurrent.futures.Executor | None = None) -> Worker:
    count_tokens("warm")  # load the tokenizer file now, not inside a workflow task
    memory_workflows, memory_activities = _memory_parts(settings)
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[SessionWorkflow, *memory_workflows],
        activities=[*session_activities(settings), *memory_activities],
        interceptors=list(interceptors),
        activity_executor=activity_executor,
        max_concurrent_activities=50,
    )


async def run_worker(client: Client, settings: KeelSettings,
                     stop: asyncio.Event | None = None) -> None:
    """Run until `stop` is set (or forever), then shut down cleanly."""
    worker = build_worker(client, settings)
    async with worker:
        await (stop or asyncio.Event()).wait()
