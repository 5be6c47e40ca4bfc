"""A delegate call's child session: whether it may start, and what it starts with. Pure.

Invariants:
- `child_input` is the one place a child's start input is made: the parent's workflow
  (workflows.delegation) and the parent's model call that starts the child ahead
  (activities.session) make the same input from the same call and state.
- `refusal` is the one place a delegate call is refused (the call's error result).
- `ahead_call`: a model call may start the child of its reply's call itself only when that
  call is the reply's only one, waits, needs no approval and would not be refused; the
  parent's workflow then takes the child as started (its start is idempotent by id).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from fnmatch import fnmatchcase

from pydantic import BaseModel, Field

from schemas.agent import AgentSpec, ApprovalPolicy, approval_for, child_spec
from schemas.attachments import Attachment, attachment_problem
from schemas.budget import Spend, spend_of
from schemas.initiative import ChildRun, DelegatedTask, child_scope, child_session_id
from schemas.messages import ModelReply, ToolCall
from schemas.session import AgentRunInput, SessionConfig, SessionInput

__all__ = ["ANSWER_CHARS", "BRING_BACK_PATTERNS", "DelegateAhead", "TellParent", "ahead_call",
           "answer_of", "brought", "child_input", "child_run", "refusal"]

# A delegate call's `bring_back`: at most this many patterns, each this long at most.
BRING_BACK_PATTERNS, BRING_BACK_CHARS = 20, 200


def brought(path: str, patterns: list[str] | None) -> bool:
    """Whether a file the child wrote comes home: every one when the call named no
    patterns; else one whose path a pattern matches (`*` spans folders: `*.png` is every
    PNG)."""
    return patterns is None or any(fnmatchcase(path, p) for p in patterns)


def _bring_back_problem(value: object) -> str | None:
    if value is None:
        return None
    fits = isinstance(value, list) and len(value) <= BRING_BACK_PATTERNS and all(
        isinstance(p, str) and 0 < len(p) <= BRING_BACK_CHARS for p in value)
    if not fits:
        return (f"bring_back must be a list of at most {BRING_BACK_PATTERNS} path patterns "
                f"(like \"report.md\" or \"*.png\"), each 1 to {BRING_BACK_CHARS} characters.")
    return None


class DelegateAhead(BaseModel):
    """What a parent's model call needs to start its reply's child itself: the session's
    config without its agent (the call's `ModelAsk` carries that: `with_agent`), the
    spend before the call, the children working."""

    parent_session: str
    config: SessionConfig
    spent: Spend
    active: int

    def with_agent(self, agent: AgentSpec | None) -> SessionConfig:
        return self.config.model_copy(update={"agent": agent})


def _depth(config: SessionConfig) -> int:
    return (config.delegated.depth if config.delegated else 0) + 1


def refusal(config: SessionConfig, call: ToolCall, active: int,
            stopped_reason: str | None) -> str | None:
    spec = config.agent
    agent_name, task = call.input.get("agent"), call.input.get("task")
    if spec is None or not spec.sub_agents:
        return "This agent has no sub-agents."
    if stopped_reason:
        return f"this session is ending ({stopped_reason})"
    if not any(a.name == agent_name for a in spec.sub_agents):
        return (f"There is no sub-agent {agent_name!r} (there are: "
                f"{', '.join(a.name for a in spec.sub_agents)}).")
    if not isinstance(task, str) or not task.strip():
        return "task must be a non-empty string: what the sub-agent should do."
    files = call.input.get("files", [])
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return "files must be a list of paths of files in your workspace."
    if files and (problem := attachment_problem(files)):
        return problem
    if problem := _bring_back_problem(call.input.get("bring_back")):
        return problem
    if len(task) > config.max_message_chars:
        return (f"task has {len(task)} characters; the limit is "
                f"{config.max_message_chars} (put it in a file and name it)")
    if _depth(config) > spec.delegation.max_depth:
        return f"delegation is {spec.delegation.max_depth} levels deep at most"
    if active >= spec.delegation.max_children:
        return (f"{active} sub-agents are working already, the most at once; "
                "wait for one to answer")
    return None


def child_run(parent_session: str, config: SessionConfig, call: ToolCall,
              now: datetime) -> ChildRun:
    spec = config.agent
    assert spec is not None
    agent = next(a for a in spec.sub_agents if a.name == call.input["agent"])
    return ChildRun(session_id=child_session_id(parent_session, agent.name, call.id),
                    agent=agent.name, call_id=call.id, started=now,
                    deadline=now + timedelta(seconds=agent.timeout_s),
                    wait=call.input.get("wait", True) is not False)


def child_input(parent_session: str, config: SessionConfig, call: ToolCall, spent: Spend,
                *, answer_in_result: bool, files: list[Attachment] | None = None
                ) -> SessionInput:
    """The child's start (`files`: the call's, copied to its workspace); ValueError when
    its memory scope is not the parent's or narrower."""
    spec = config.agent
    assert spec is not None
    agent = next(a for a in spec.sub_agents if a.name == call.input["agent"])
    depth = _depth(config)
    child_id = child_session_id(parent_session, agent.name, call.id)
    child_config = config.with_agent(child_spec(spec, agent, depth, spent)).model_copy(
        update={"memory_scope": child_scope(agent, config.memory_scope),
                "delegated": DelegatedTask(parent_session=parent_session, call_id=call.id,
                                           agent=agent.name, task=call.input["task"],
                                           depth=depth, answer_in_result=answer_in_result,
                                           hears_call=True, files=files or [],
                                           bring_back=call.input.get("bring_back"))})
    return SessionInput(session_id=child_id, config=child_config)


def ahead_call(config: SessionConfig, active: int, calls: list[ToolCall]) -> ToolCall | None:
    """The call whose child a model call may start itself: its reply's only call, a
    `delegate` that waits, needs no approval and is not refused."""
    if len(calls) != 1 or calls[0].name != "delegate":
        return None
    call = calls[0]
    if call.input.get("wait", True) is False or call.input.get("files"):
        return None  # files are copied to the child's workspace first: the workflow's way
    if approval_for(config.agent, "delegate") is not ApprovalPolicy.ALLOW:
        return None
    if refusal(config, call, active, None) is not None:
        return None
    return call


ANSWER_CHARS = 50_000  # of a child's answer sent back; the child's record has it whole


class TellParent(BaseModel):
    """A child's task turn: its final reply goes to its parent from the model call."""

    parent_session: str
    call_id: str
    spent: Spend  # the child's spend before this call
    files: list[Attachment] = Field(default_factory=list)  # its task's (what it was given)
    bring_back: list[str] | None = None  # the call's patterns of the files to send home


def answer_of(session_id: str, tell: TellParent, reply: ModelReply) -> AgentRunInput | None:
    """The answer a final `reply` makes (what the child's workflow would send at its end);
    None when the reply is not final (it calls tools, was interrupted, has no text)."""
    if reply.tool_calls or reply.interrupted or not reply.text.strip():
        return None
    return AgentRunInput(run_id=tell.call_id, from_session=session_id,
                         text=reply.text[:ANSWER_CHARS], outcome="answered",
                         input_id=f"delegate-answer-{session_id}",
                         spent=tell.spent.plus(spend_of(reply.usage, reply.cost_usd)))
