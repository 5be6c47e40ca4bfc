"""Record workflow histories for the replay tests: `python scripts/record_histories.py [NAME]`.

Runs the scenario NAME (the queue's, `history-queue-checkpoints`, when none is given) on a
throwaway embedded stack with the offline model, or on the fake Messages API
(tests/fake_anthropic, on loopback) for the scenarios that script the model, and saves its
history, and those of the workflows it started that the scenario keeps, as JSON under
tests/session/histories/. The scenarios, one module per concern, and what each covers are
in scripts/histories/ (its package docstring lists them by module).

Re-record only on purpose: a change that breaks replay of the committed histories would
break every running session.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

# The repository's root, for scripts.histories and the project's packages.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.worker import Worker

from examples.support.service import TASK_QUEUE as SUPPORT_QUEUE
from examples.support.service import toolset
from keel.client import KeelClient
from keel.devstack import running_stack
from schemas.config import KeelSettings, ModelSettings
from scripts.histories.agent import agent_scenario
from scripts.histories.branch import (
    branch_scenario,
    rewind_children_model,
    rewind_children_scenario,
    rewind_model,
    rewind_scenario,
)
from scripts.histories.budget import budget_scenario
from scripts.histories.common import (
    AGENT_SCENARIO,
    ATTACHMENTS_SCENARIO,
    BRANCH_SCENARIO,
    BUDGET_SCENARIOS,
    CARRY_SCENARIO,
    EARLY_SCENARIO,
    HANDBACK_SCENARIO,
    HANDBACK_SHOWN_SCENARIO,
    INITIATIVE_SCENARIOS,
    LIMITS_SCENARIO,
    OUT,
    REFUSED_ID_SCENARIO,
    REFUSED_SCENARIO,
    REWIND_CHILDREN_SCENARIO,
    REWIND_SCENARIO,
    TOOL_FILES_SCENARIO,
)
from scripts.histories.files import (
    attachments_model,
    attachments_scenario,
    handback_model,
    handback_scenario,
    handback_shown_model,
    tool_files_model,
    tool_files_scenario,
)
from scripts.histories.initiative import (
    EARLY_FAULTS,
    initiative_model,
    initiative_scenario,
)
from scripts.histories.limits import (
    limits_scenario,
    refused_id_scenario,
    refused_scenario,
)
from scripts.histories.queue import carry_scenario, queue_scenario
from tests.fake_anthropic import FakeAnthropic
from workers.worker import build_worker


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["REFUND_LOG"] = str(Path(tmp) / "refunds.jsonl")  # the service's own log
        settings = KeelSettings(data_dir=Path(tmp), task_queue="keel-record")
        session_id = sys.argv[1] if len(sys.argv) > 1 else "history-queue-checkpoints"
        models = {**dict.fromkeys(INITIATIVE_SCENARIOS, initiative_model),
                  REWIND_SCENARIO: rewind_model, ATTACHMENTS_SCENARIO: attachments_model,
                  TOOL_FILES_SCENARIO: tool_files_model, HANDBACK_SCENARIO: handback_model,
                  HANDBACK_SHOWN_SCENARIO: handback_shown_model(settings.workspaces_dir),
                  REWIND_CHILDREN_SCENARIO: rewind_children_model}
        fake = (FakeAnthropic(models[session_id]) if session_id in models
                else FakeAnthropic()).start()
        if session_id in (*BUDGET_SCENARIOS, *models):  # a fake API on loopback
            settings = settings.model_copy(update={"model": ModelSettings(
                base_url=fake.base_url, api_key="recorder", request_timeout_s=30)})
        async with running_stack(settings) as stack:
            settings = settings.model_copy(update={"database_url": stack.database_url})
            service = toolset(SUPPORT_QUEUE)
            faults = EARLY_FAULTS if session_id == EARLY_SCENARIO else None
            async with build_worker(
                    faults.client(stack.client) if faults else stack.client, settings,
                    interceptors=[faults] if faults else []), Worker(
                    stack.client, task_queue=SUPPORT_QUEUE, activities=service.activities()):
                keel = KeelClient(stack.client, settings.task_queue, settings)
                if session_id in BUDGET_SCENARIOS:
                    session = await budget_scenario(keel, fake, session_id)
                else:
                    scenario = {AGENT_SCENARIO: agent_scenario, CARRY_SCENARIO: carry_scenario,
                                BRANCH_SCENARIO: branch_scenario,
                                LIMITS_SCENARIO: limits_scenario,
                                ATTACHMENTS_SCENARIO: attachments_scenario,
                                TOOL_FILES_SCENARIO: tool_files_scenario,
                                HANDBACK_SCENARIO: handback_scenario,
                                HANDBACK_SHOWN_SCENARIO: handback_scenario,
                                REFUSED_SCENARIO: refused_scenario,
                                REFUSED_ID_SCENARIO: refused_id_scenario,
                                **dict.fromkeys(INITIATIVE_SCENARIOS, initiative_scenario),
                                REWIND_SCENARIO: rewind_scenario,
                                REWIND_CHILDREN_SCENARIO: rewind_children_scenario}.get(
                                    session_id, queue_scenario)
                    session = await scenario(keel, settings, session_id)
                if session_id not in (REFUSED_SCENARIO, REFUSED_ID_SCENARIO):  # no query
                    status = await session.status()
                    print(f"{session_id}: {status.checkpoint_count} checkpoints, "
                          f"turn {status.turn}")
                OUT.mkdir(parents=True, exist_ok=True)
                if session_id == CARRY_SCENARIO:
                    runs = sorted([r async for r in stack.client.list_workflows(
                        f"WorkflowId = '{session_id}'")], key=lambda r: r.start_time)
                    for suffix, run in zip("ab", runs[-2:], strict=True):
                        history = await stack.client.get_workflow_handle(
                            session_id, run_id=run.run_id).fetch_history()
                        (OUT / f"{session_id}@{suffix}.json").write_text(history.to_json())
                else:
                    history = await session.handle.fetch_history()
                    # Named by its workflow id, which the replay test reads from the name.
                    (OUT / f"{session.session_id}.json").write_text(history.to_json())
        fake.stop()


if __name__ == "__main__":
    asyncio.run(main())
