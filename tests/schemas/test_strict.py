"""What an agent spec may hold (schemas/strict.py, its use in schemas/agent.py and
schemas/mcp.py): unknown fields refused naming where the value belongs, secrets refused by
field and never quoted, data Keel wrote itself still read; and input_problem on a schema it
cannot apply. Pure: no server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from schemas.agent import BUILTIN_TOOL_NAMES, AgentSpec, input_problem, spec_problems
from schemas.mcp import McpServerSpec
from schemas.session import SessionInput
from schemas.strict import STORED, arg_secret_problems, secret_problem, url_problem

TOKEN = "sk-live0123456789abcdefghijklmnop"


def refusal(data: dict, model: type[BaseModel] = AgentSpec) -> str:
    with pytest.raises(ValidationError) as err:
        model.model_validate(data)
    text = str(err.value)
    assert TOKEN not in text, "a refusal never quotes the value"
    return text


def test_a_top_level_key_is_refused_saying_where_a_key_belongs():
    text = refusal({"instructions": "hi", "api_key": TOKEN})
    assert "unknown field 'api_key': a spec never holds a key or a secret" in text
    assert "provider profile" in text


@pytest.mark.parametrize("data, field, says", [
    ({"mcp_servers": [{"name": "d", "stdio": {"command": "x", "env": {"API_KEY": TOKEN}}}]},
     "mcp_servers.0.stdio", "unknown field 'env': an MCP server's environment"),
    ({"mcp_servers": [{"name": "w", "http": {"url": "http://h/mcp",
                                             "headers": {"Authorization": TOKEN}}}]},
     "mcp_servers.0.http", "unknown field 'headers': an HTTP header's value"),
    ({"mcp_servers": [{"name": "d", "stdio": {"command": "x"}, "token": TOKEN}]},
     "mcp_servers.0", "unknown field 'token'"),
    ({"tools": [{"name": "t", "activity": "a", "task_queue": "q", "secret": TOKEN}]},
     "tools.0", "unknown field 'secret'"),
    ({"approvals": {"tools": {}, "auto": True}}, "approvals", "unknown field 'auto'"),
    ({"instructions": "x", "colour": "blue"}, "", "unknown field 'colour' (AgentSpec takes"),
])
def test_an_unknown_field_anywhere_in_the_spec_is_refused_by_its_path(data, field, says):
    text = refusal(data)
    assert says in text
    assert f"\n{field}\n" in text or (not field and "for AgentSpec\n  Value error" in text)


def test_what_keel_wrote_itself_still_reads_its_unknown_fields_dropped():
    """A history or a carried state from before: read as it was (unknown fields dropped)."""
    data = {"session_id": "s", "config": {"agent": {"api_key": "x", "mcp_servers": [
        {"name": "d", "stdio": {"command": "x", "env": {"A": "b"}}}]}}}
    read = SessionInput.model_validate(data, context=STORED)
    assert read.config.agent is not None
    assert read.config.agent.mcp_servers[0].stdio is not None
    with pytest.raises(ValidationError):
        SessionInput.model_validate(data)


@pytest.mark.parametrize("server, where", [
    ({"name": "d", "stdio": {"command": "x", "args": ["--api-key", TOKEN]}}, "stdio.args[1]"),
    ({"name": "d", "stdio": {"command": "x", "args": ["--token=abc"]}}, "stdio.args[0]"),
    ({"name": "d", "stdio": {"command": "x", "args": [f"--auth={TOKEN}"]}}, "stdio.args[0]"),
    ({"name": "d", "stdio": {"command": "x", "env_names": ["sk_live_0123456789abcdef"]}},
     "stdio.env_names[0]"),
    ({"name": "w", "http": {"url": f"https://h.test/mcp?access_token={TOKEN}"}}, "http.url"),
    ({"name": "w", "http": {"url": "https://h.test/mcp?sig=abc"}}, "http.url"),
    ({"name": "w", "http": {"url": f"https://h.test/{TOKEN}/mcp"}}, "http.url"),
])
def test_a_secret_written_into_a_value_is_a_problem_naming_the_field(server, where):
    problems = spec_problems(AgentSpec(mcp_servers=[McpServerSpec(**server)]),
                             BUILTIN_TOOL_NAMES)
    assert any(where in p for p in problems), problems
    assert not any(TOKEN in p for p in problems)


@pytest.mark.parametrize("data", [
    {"mcp_servers": [{"name": "d", "stdio": {"command": "python", "args": [
        "server.py", "--port", "8080", "--keyfile=/etc/keys/a.pem", "-v"],
        "env_names": ["DOCS_TOKEN", "API_KEY"]}}]},
    {"mcp_servers": [{"name": "w", "http": {"url": "https://h.test/mcp?page=2",
                                            "header_env": {"Authorization": "WEB_AUTH"}}}]},
    {"provider": "work", "model": "claude-sonnet-5", "instructions": "Use sk-learn."},
])
def test_names_and_ordinary_values_are_no_secret(data):
    assert spec_problems(AgentSpec.model_validate(data), BUILTIN_TOOL_NAMES) == []


def test_a_header_value_where_a_variable_name_belongs_is_never_quoted():
    text = refusal({"name": "w", "http": {"url": "http://h/mcp", "header_env": {
        "Authorization": f"Bearer {TOKEN}"}}}, McpServerSpec)
    assert "the variable for header 'Authorization' is not an environment variable name" in text


@pytest.mark.parametrize("value", [
    TOKEN, "ghp_" + "a" * 36, "AKIAIOSFODNN7EXAMPLE", "xoxb-1234567890-abcdef",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
    "-----BEGIN RSA PRIVATE KEY-----", "Bearer abcdefghijklmnop",
])
def test_known_token_shapes_are_secrets(value):
    assert secret_problem(value)


@given(st.text(alphabet=st.characters(categories=["Lu", "Nd"]) | st.just("_"), max_size=40))
def test_an_environment_variable_name_is_never_a_secret(name):
    assert secret_problem(name) is None or name.startswith(("AKIA", "ASIA"))


def test_args_and_urls():
    assert [i for i, _ in arg_secret_problems(["--token", "$TOKEN", "--password=x"])] == [2]
    assert url_problem("https://h/mcp?token=${TOKEN}") is None
    assert url_problem("https://h/mcp?key=abc")


@pytest.mark.parametrize("schema, data, says", [
    ({"$schema": "http://json-schema.org/draft-03/schema#", "type": "object",
      "properties": {"a": {"type": "string", "required": True}}}, {}, "field 'a'"),
    ({"type": "object", "required": True}, {}, "cannot be applied"),
    ({"type": "object", "properties": {"a": {"type": 5}}}, {"a": 1}, "cannot be applied"),
    ({"type": "object", "required": ["a"]}, {}, "field 'a'"),
])
def test_input_problem_says_what_it_cannot_apply_never_raises(schema, data, says):
    problem = input_problem(schema, data)
    assert problem is not None and says in problem
