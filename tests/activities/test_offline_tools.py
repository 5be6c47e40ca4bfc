"""The offline model's rule for a session's declared tools (activities.offline.tools): which
tools the instructions plan, and the delay a wakeup gets. Pure: no server."""

from __future__ import annotations

from activities.offline.tools import arguments, delay_s, planned
from schemas.agent import AgentSpec, child_spec
from schemas.context import SystemPromptParts, build_system_prompt
from schemas.initiative import SubAgent, WakeupLimits

CHECKER = SubAgent(name="checker", description="checks the release notes",
                   instructions="You check release notes and answer in one line.")
PARENT = AgentSpec(instructions="You watch a release. First ask the checker with delegate, "
                                "then plan a second look with schedule_wakeup.",
                   wakeups=WakeupLimits(), sub_agents=[CHECKER])
TOOLS = [{"name": name, "input_schema": {"type": "object"}}
         for name in ("schedule_wakeup", "delegate", "list_wakeups")]


def _request(spec: AgentSpec) -> dict:
    return {"system": build_system_prompt(SystemPromptParts(instructions=spec.instructions)),
            "tools": TOOLS}


def test_the_parent_plans_its_tools_in_the_order_its_instructions_name_them() -> None:
    assert [t["name"] for t in planned(_request(PARENT))] == ["delegate", "schedule_wakeup"]


def test_a_sub_agent_told_its_task_was_delegated_plans_no_delegate_call() -> None:
    """The child's instructions say "another agent delegated one task to you" (CHILD_NOTE):
    the offline checker used to call `delegate` with no task, and answered with its error."""
    child = child_spec(PARENT, CHECKER, depth=1)
    assert "delegated" in child.instructions and child.sub_agents  # delegate is offered
    assert planned(_request(child)) == []


def test_a_wakeup_comes_after_the_delay_the_person_named() -> None:
    wakeup = {"name": "schedule_wakeup", "input_schema": {"type": "object"}}
    cases = {"check release 1.2 and look again in 3 seconds": 3,  # not the version's 1
             "Look again in 3 seconds.": 3, "v1.2.3 in 5s": 5, "in 2 min": 120,
             "A-1001: again in 1 hour": 3600, "again after 45": 45, "status?": 60}
    for message, seconds in cases.items():
        assert delay_s(message) == seconds, message
        assert arguments(wakeup, message, [])["after_s"] == seconds
