"""What the delegation tests share, and the UI, chat and delete tests that drive a parent
and its sub-agent: a parent agent with one sub-agent, "researcher" (`spec`); one fake model
that plays both sides (`team`, with `writing_child` for a child that asks to write a file);
and reads of the record and of Temporal (`rows`, `_closed`, `_awaiting_child`).

Invariant: the parent delegates its first message and reads the answer when it comes back;
the child is told apart by Keel's child note in its system prompt (`CHILD_NOTE`), so a
single responder answers both, and a test says only what its child does.

Not a test module (no test_ prefix): pytest does not collect it; tests import it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import psycopg
from temporalio.client import WorkflowExecutionStatus

from schemas.agent import CHILD_NOTE, AgentSpec, ApprovalPolicy, ApprovalRules
from schemas.initiative import SubAgent
from schemas.session import SessionPhase
from tests.fake_anthropic import text_message, tool_use_message


def spec(timeout_s: float = 60, child_asks: bool = False) -> AgentSpec:
    return AgentSpec(
        instructions="You run a small team.",
        sub_agents=[SubAgent(name="researcher", instructions="You look things up.",
                             timeout_s=timeout_s)],
        approvals=ApprovalRules(tools={"write_file": ApprovalPolicy.ASK}) if child_asks
        else ApprovalRules())


def _system(body: dict[str, Any]) -> str:
    system = body.get("system") or ""
    return system if isinstance(system, str) else " ".join(b.get("text", "") for b in system)


def _last(body: dict[str, Any]) -> str:
    content = body["messages"][-1]["content"]
    return content if isinstance(content, str) else json.dumps(content)


def team(child: Any, wait: bool = True) -> Any:
    """The parent delegates its first message; the child answers with `child(body)`."""
    def respond(body: dict[str, Any]) -> Any:
        if CHILD_NOTE in _system(body):
            return child(body)
        last = _last(body)
        if "agent run" in last or "tool_result" in last:
            return text_message("parent done: " + last[-400:])
        return tool_use_message([("delegate", {"agent": "researcher", "task": last[-200:],
                                               "wait": wait})])
    return respond


def writing_child(before_asking: Callable[[], object] | None = None) -> Any:
    """A sub-agent that asks to write x.md (a call its parent's person approves, with
    `spec(child_asks=True)`), then answers "wrote it"; `before_asking` runs first."""
    def child(body: dict[str, Any]) -> Any:
        if "tool_result" in _last(body):
            return text_message("wrote it")
        if before_asking is not None:
            before_asking()
        return tool_use_message([("write_file", {"path": "x.md", "content": "x"})])
    return child


def rows(database_url: str, session_id: str) -> list[tuple[str, str | None, str]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT type, source_line, content_text FROM messages WHERE "
                            "session_id=%s ORDER BY seq", (session_id,)).fetchall()


async def _closed(client: Any, workflow_id: str, within_s: float = 20) -> Any:
    handle = client.get_workflow_handle(workflow_id)
    for _ in range(int(within_s * 5)):
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            return desc.status
        await asyncio.sleep(0.2)
    return desc.status


async def _awaiting_child(parent: Any, within_s: float = 20) -> Any:
    """The parent's status once its turn waits on a child (asserted)."""
    for _ in range(int(within_s * 5)):
        status = await parent.status()
        if status.phase == SessionPhase.AWAITING_CHILD:
            break
        await asyncio.sleep(0.2)
    assert status.phase == SessionPhase.AWAITING_CHILD
    return status
