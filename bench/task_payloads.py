"""How large a session's workflow tasks are, read from its histories (every run).

Invariant: a figure here is the server's own record, the bytes of the history events'
payloads, never Keel's estimate. A workflow task is counted as what it was handed (the
events since the previous task completed: activity results, signals, updates, the run's
input) plus what it answered (the events its commands wrote: activity inputs, the
continue-as-new input, update results). The largest one is the issue's figure.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

__all__ = ["task_payloads"]

_STARTED = EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED


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
    async for run in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        history = await client.get_workflow_handle(workflow_id,
                                                   run_id=run.run_id).fetch_history()
        for event in history.events:
            largest_event = max(largest_event, (_payload_bytes(event), _name(event)))
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
    }
