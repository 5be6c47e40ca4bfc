"""The pure rules of a delegate call's child (schemas.delegation): which reply's call a
model call may start the child of itself, the child's start input (the one the workflow
would make), and the answer a child's final reply tells its parent."""

from __future__ import annotations

from typing import Any

from schemas.agent import AgentSpec, ApprovalPolicy, ApprovalRules
from schemas.budget import Spend
from schemas.delegation import (
    ANSWER_CHARS,
    DelegateAhead,
    TellParent,
    ahead_call,
    answer_of,
    child_input,
    refusal,
)
from schemas.initiative import DelegationLimits, SubAgent, child_session_id
from schemas.messages import ModelReply, ToolCall, Usage
from schemas.session import SessionConfig

SPEC = AgentSpec(instructions="Lead.", sub_agents=[SubAgent(name="helper",
                                                            instructions="Help.")])


def config(**spec: Any) -> SessionConfig:
    return SessionConfig(memory_scope=None).with_agent(SPEC.model_copy(update=spec))


def call(name: str = "delegate", **given: Any) -> ToolCall:
    return ToolCall(id="toolu_1", name=name, input={"agent": "helper", "task": "look",
                                                     **given})


def test_only_a_reply_whose_one_call_is_a_waiting_allowed_delegate_is_started_ahead():
    assert ahead_call(config(), 0, [call()]) == call()
    assert ahead_call(config(), 0, [call(wait=True)]) is not None
    assert ahead_call(config(), 0, [call(wait=False)]) is None  # goes on: the workflow's
    assert ahead_call(config(), 0, [call(), call("read_file")]) is None  # order matters
    assert ahead_call(config(), 0, [call("read_file")]) is None
    asks = config(approvals=ApprovalRules(tools={"delegate": ApprovalPolicy.ASK}))
    assert ahead_call(asks, 0, [call()]) is None  # a person decides first
    assert ahead_call(config(), 0, [call(agent="nobody")]) is None  # refused
    full = config(delegation=DelegationLimits(max_children=1))
    assert ahead_call(full, 1, [call()]) is None
    assert "1 sub-agents are working already" in (refusal(full, call(), 1, None) or "")
    assert "ending" in (refusal(config(), call(), 0, "ended") or "")


def test_the_child_started_ahead_is_the_one_the_workflow_would_start():
    ahead = DelegateAhead(parent_session="lead", config=config().with_agent(None),
                          spent=Spend(output_tokens=5), active=0)
    made = child_input("lead", ahead.with_agent(config().agent), call(), ahead.spent,
                       answer_in_result=False)
    same = child_input("lead", config(), call(), Spend(output_tokens=5),
                       answer_in_result=False)
    assert made == same
    assert made.session_id == child_session_id("lead", "helper", "toolu_1")
    assert made.config.delegated is not None and made.config.delegated.task == "look"


def test_only_a_final_reply_is_told_with_the_childs_spend_and_this_call():
    tell = TellParent(parent_session="lead", call_id="toolu_1",
                      spent=Spend(output_tokens=10, usd=0.5))
    reply = ModelReply(seq=4, stop_reason="end_turn", text="42" * ANSWER_CHARS,
                       usage=Usage(input_tokens=3, output_tokens=2), cost_usd=0.25)
    answer = answer_of("lead.helper.toolu_1", tell, reply)
    assert answer is not None and answer.outcome == "answered"
    assert len(answer.text) == ANSWER_CHARS and answer.run_id == "toolu_1"
    assert answer.input_id == "delegate-answer-lead.helper.toolu_1"
    assert answer.spent == Spend(input_tokens=3, output_tokens=12, usd=0.75)
    calls = reply.model_copy(update={"tool_calls": [call("read_file")]})
    assert answer_of("c", tell, calls) is None
    assert answer_of("c", tell, reply.model_copy(update={"interrupted": True})) is None
    assert answer_of("c", tell, reply.model_copy(update={"text": "  "})) is None


def test_a_call_may_name_the_files_to_bring_back_and_a_malformed_list_is_refused():
    from schemas.delegation import BRING_BACK_PATTERNS, brought

    assert refusal(config(), call(bring_back=["report.md", "*.png"]), 0, None) is None
    for bad in ("*.png", [1], [""], ["x" * 201], ["*"] * (BRING_BACK_PATTERNS + 1)):
        problem = refusal(config(), call(bring_back=bad), 0, None)
        assert problem and problem.startswith("bring_back must be a list"), bad
    start = child_input("lead", config(), call(bring_back=["*.png"]), Spend(),
                        answer_in_result=False)
    assert start.config.delegated is not None
    assert start.config.delegated.bring_back == ["*.png"]
    assert child_input("lead", config(), call(), Spend(), answer_in_result=False
                       ).config.delegated.bring_back is None
    assert brought("charts/q3.png", ["*.png"]) and brought("report.md", ["report.md"])
    assert not brought("notes.txt", ["*.png", "report.md"]) and brought("notes.txt", None)
    assert not brought("x.png", [])  # an empty list: nothing comes back
