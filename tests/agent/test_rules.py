"""The pure rules of schemas/agent.py and the service helper's declarations."""

from __future__ import annotations

from pathlib import Path

from examples.support.service import toolset
from schemas.agent import (
    BUILTIN_TOOL_NAMES,
    AgentSpec,
    ApprovalPolicy,
    ApprovalRules,
    approval_for,
    check_spec,
    input_problem,
    session_tools,
    spec_from_text,
)
from schemas.mcp import McpServerSpec, make_tool

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "support" / "agent.toml"


def test_helper_declares_schema_from_type_hints():
    tools = {t.name: t for t in toolset("q").declarations()}
    assert tools["lookup_order"].input_schema["required"] == ["order_id"]
    assert tools["refund"].input_schema["properties"]["amount_cents"]["type"] == "integer"
    assert "call" not in tools["refund"].input_schema["properties"]  # the call is not input
    assert tools["refund"].approval is ApprovalPolicy.ASK
    assert tools["refund"].max_attempts == 1  # side effects: once unless told


def test_tool_list_is_one_order_and_policy_precedence():
    mcp = make_tool("docs", "search_docs", "", {"type": "object"})
    assert not isinstance(mcp, str)
    docs = McpServerSpec(name="docs", stdio={"command": "docs-server"})
    spec = AgentSpec(builtin_tools=["read_file"], tools=toolset("q").declarations(),
                     mcp_servers=[docs],
                     approvals=ApprovalRules(tools={"lookup_order": "deny"},
                                             default_mcp="ask"))
    names = [t["name"] for t in session_tools([{"name": n} for n in BUILTIN_TOOL_NAMES],
                                              spec, [mcp])]
    assert names == ["read_file", "lookup_order", "refund", "mcp__docs__search_docs"]
    # A server the spec no longer declares: its listed tools are not offered.
    undeclared = spec.model_copy(update={"mcp_servers": []})
    assert "mcp__docs__search_docs" not in [t["name"] for t in session_tools(
        [{"name": n} for n in BUILTIN_TOOL_NAMES], undeclared, [mcp])]
    assert approval_for(spec, "lookup_order") is ApprovalPolicy.DENY  # the spec's rule wins
    assert approval_for(spec, "refund") is ApprovalPolicy.ASK  # the tool's declaration
    assert approval_for(spec, "mcp__docs__search_docs") is ApprovalPolicy.ASK
    assert approval_for(spec, "read_file") is ApprovalPolicy.ALLOW  # built-ins: allow


def test_input_problem_names_the_field():
    schema = toolset("q").declarations()[1].input_schema
    said = input_problem(schema, {"order_id": "A-1", "amount_cents": "lots"})
    assert said and "'amount_cents'" in said
    said = input_problem(schema, {"order_id": "A-1"})
    assert said and "'amount_cents'" in said
    assert input_problem(schema, {"order_id": "A-1", "amount_cents": 5}) is None


def test_example_spec_file_is_valid():
    spec = spec_from_text(EXAMPLE.read_text(), ".toml")
    check_spec(spec, BUILTIN_TOOL_NAMES, ["default", "offline"])
    assert [t.name for t in spec.tools] == ["lookup_order", "refund"]
    assert spec.mcp_servers[0].name == "docs"
