"""Build and run a Keel worker: the session workflow, the checkpoint chain, long memory."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

from temporalio.client import Client
from temporalio.worker import Interceptor, Worker

from activities.checkpoint import CheckpointActivities
from activities.session import SessionActivities
from activities.vault import memory_activities
from schemas.config import KeelSettings
from schemas.tokens import count_tokens
from workflows.rollup import MEMORY_WORKFLOWS
from workflows.session import SessionWorkflow


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
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[SessionWorkflow, *MEMORY_WORKFLOWS],
        activities=[*session_activities(settings), *memory_activities(settings)],
        interceptors=list(interceptors),
        activity_executor=activity_executor,
        max_concurrent_activities=50,
    )
