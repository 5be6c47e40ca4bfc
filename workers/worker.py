"""Build and run a Keel worker: the session workflow, the checkpoint chain, long memory.

Every workflow and activity a worker runs is listed here by name, so a reader sees all of
them in one place and nothing is registered by scanning a class.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

from temporalio.client import Client
from temporalio.worker import Interceptor, Worker

from activities.checkpoint import CheckpointActivities
from activities.mcp import McpActivities
from activities.session import SessionActivities
from activities.vault.cards import VaultActivities
from activities.vault.doctor import DoctorActivities
from activities.vault.rollup import RollupActivities
from activities.vault.store import MemoryContext
from activities.vault.turn import MemoryActivities
from schemas.config import KeelSettings
from schemas.tokens import count_tokens
from workflows.doctor import DoctorWorkflow
from workflows.rollup import ROLLUP_WORKFLOWS
from workflows.session import SessionWorkflow

# Everything long memory runs, for one worker registration.
MEMORY_WORKFLOWS: list[type] = [*ROLLUP_WORKFLOWS.values(), DoctorWorkflow]


def session_activities(settings: KeelSettings) -> list[Callable[..., Any]]:
    session = SessionActivities(settings)
    checkpoint = CheckpointActivities(settings)
    mcp = McpActivities()
    return [
        session.record_input, session.call_model, session.run_tool,
        session.record_tool_result, mcp.list_mcp_tools, mcp.call_mcp_tool,
        checkpoint.prepare_checkpoint, checkpoint.checkpoint_round,
        checkpoint.validate_checkpoint, checkpoint.store_checkpoint,
        checkpoint.move_earliest_half,
    ]


def memory_activities(settings: KeelSettings, *,
                      database_url: str | None = None) -> list[Callable[..., Any]]:
    """Every long-memory activity, bound to these settings (their `memory`), for one worker.

    `database_url` overrides `settings.database_url` (the embedded stack knows it only once
    it has started).
    """
    url = database_url or settings.database_url
    if not url:
        raise ValueError("memory activities need a database URL")
    ctx = MemoryContext(settings=settings, database_url=url)
    vault = VaultActivities(ctx)
    turn = MemoryActivities(ctx)
    rollup = RollupActivities(ctx)
    doctor = DoctorActivities(ctx)
    return [
        vault.init_vault, vault.reindex_vault, vault.write_card,
        turn.recall_memory, turn.flush_memory, turn.append_transcript,
        rollup.plan_rollup_periods, rollup.plan_rollup, rollup.apply_rollup, rollup.notify,
        rollup.commit_vault,
        doctor.doctor_enforce, doctor.doctor_graph, doctor.doctor_decay, doctor.doctor_moc,
        doctor.doctor_scans, doctor.doctor_core_check, doctor.doctor_reindex,
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
