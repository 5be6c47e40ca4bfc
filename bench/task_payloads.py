"""How large a session's workflow tasks are, read from its histories (every run).

Invariant: a figure here is the server's own record, the bytes of the history events'
payloads, never Keel's estimate. A workflow task is counted as what it was handed (the
events since the previous task completed: activity results, signals, updates, the run's
input) plus what it answered (the events its commands wrote: activity inputs, the
continue-as-new input, update results). The largest one is the issue's figure.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

__all__ = ["task_payloads"]

_STARTED = EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
_CONTINUED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW


def _payload_bytes(event: HistoryEvent) -> int:
    """Bytes of every Payload inside the event (metadata included), found by walking it."""
    total = 0
    stack: list[Any] = [event]
    while stack:
        msg = stack.pop()
        if type(msg).__name__ == "Payload":
            total += msg.ByteSize()
            continue
        for field, value in msg.ListFields():
            if field.message_type is None:
                continue
            if hasattr(value, "ListFields"):
                stack.append(value)
            elif hasattr(value, "values"):  # a map: its message values
                stack.extend(v for v in value.values() if hasattr(v, "ListFields"))
            else:
                stack.extend(value)
    return total


def _input_parts(event: HistoryEvent) -> dict[str, int]:
    """A run's input (a continue-as-new's), by field: its state's fields and the rest."""
    attrs = event.workflow_execution_continued_as_new_event_attributes
    try:
        data = json.loads(b"".join(p.data for p in attrs.input.payloads))
    except ValueError:
        return {}
    state = data.pop("state", None) or {}
    parts = {f"state.{k}": len(json.dumps(v)) for k, v in state.items()}
    parts.update({k: len(json.dumps(v)) for k, v in data.items()})
    return dict(sorted(parts.items(), key=lambda kv: -kv[1])[:8])


def _name(event: HistoryEvent) -> str:
    return EventType.Name(event.event_type).removeprefix("EVENT_TYPE_").lower()


def _command_of(event: HistoryEvent) -> int:
    """The WorkflowTaskCompleted event id of the task whose command wrote `event`, or 0
    for an event the server wrote (an input to the next task)."""
    kind = event.WhichOneof("attributes")
    attrs = getattr(event, kind) if kind else None
    return int(getattr(attrs, "workflow_task_completed_event_id", 0) or 0)


def _tasks(events: list[HistoryEvent]) -> list[Counter[str]]:
    """Each workflow task's payload bytes by event type: handed + answered."""
    tasks: list[Counter[str]] = []
    handed: Counter[str] = Counter()
    task_of_completed: dict[int, int] = {}
    for event in events:
        size = _payload_bytes(event)
        if event.event_type == _STARTED:
            tasks.append(handed)
            handed = Counter()
        elif event.event_type == _COMPLETED and tasks:
            task_of_completed[event.event_id] = len(tasks) - 1
        elif size:
            by = _command_of(event)
            if by in task_of_completed:
                tasks[task_of_completed[by]][_name(event)] += size
            else:
                handed[_name(event)] += size
    return tasks


async def task_payloads(client: Client, workflow_id: str) -> dict[str, Any]:
    """Per-task payload bytes of every run of `workflow_id`: the largest, the median, and
    which kinds of event make up the tasks over 64 KB."""
    sizes: list[int] = []
    over: Counter[str] = Counter()
    largest: Counter[str] = Counter()
    largest_event = (0, "")
    largest_input: tuple[int, dict[str, int]] = (0, {})
    async for run in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        history = await client.get_workflow_handle(workflow_id,
                                                   run_id=run.run_id).fetch_history()
        for event in history.events:
            size = _payload_bytes(event)
            largest_event = max(largest_event, (size, _name(event)))
            if event.event_type == _CONTINUED and size > largest_input[0]:
                largest_input = (size, _input_parts(event))
        for parts in _tasks(list(history.events)):
            sizes.append(sum(parts.values()))
            if sizes[-1] > sum(largest.values()):
                largest = parts
            if sizes[-1] > 64 * 1024:
                over.update(parts)
    ordered = sorted(sizes)
    return {
        "tasks": len(sizes),
        "largest_task_bytes": ordered[-1] if ordered else 0,
        "median_task_bytes": ordered[len(ordered) // 2] if ordered else 0,
        "tasks_over_64k": sum(1 for s in sizes if s > 64 * 1024),
        "largest_task_by_event": dict(largest.most_common()),
        "largest_event": {"bytes": largest_event[0], "type": largest_event[1]},
        "over_64k_bytes_by_event": dict(over.most_common(6)),
        "largest_continue_as_new": {"bytes": largest_input[0], "parts": largest_input[1]},
    }
