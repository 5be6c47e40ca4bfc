"""MCP declaration and namespacing rules (schemas/mcp.py): pure, no server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas.mcp import (
    API_TOOL_NAME_RE,
    CLOSE_TIMEOUT_S,
    KEEP_RESULT_S,
    McpServerSpec,
    McpTool,
    anthropic_tools,
    make_tool,
    namespace_problem,
    namespaced_name,
    parse_namespaced,
    pool_owner,
    transport_identity,
)


def test_stdio_spec_defaults():
    spec = McpServerSpec(name="docs", stdio={"command": "python", "args": ["s.py"],
                                             "env_names": ["DOCS_TOKEN"]})
    assert spec.stdio is not None and spec.stdio.env_names == ["DOCS_TOKEN"]
    assert spec.connect_s > 0 and spec.list_s > 0 and spec.call_s > 0
    assert spec.env_names() == ["DOCS_TOKEN"]


def test_http_spec_header_env():
    spec = McpServerSpec(name="web-1", http={"url": "http://127.0.0.1:9/mcp",
                                             "header_env": {"Authorization": "WEB_AUTH"}})
    assert spec.env_names() == ["WEB_AUTH"]


@pytest.mark.parametrize("kwargs", [
    {},  # neither transport
    {"stdio": {"command": "x"}, "http": {"url": "http://127.0.0.1/mcp"}},  # both
])
def test_exactly_one_transport(kwargs):
    with pytest.raises(ValidationError, match="exactly one"):
        McpServerSpec(name="s", **kwargs)


@pytest.mark.parametrize("name", ["", "a" * 33, "has space", "dot.ted", "a__b", "trail_", "é"])
def test_bad_server_names(name):
    with pytest.raises(ValidationError):
        McpServerSpec(name=name, stdio={"command": "x"})


@pytest.mark.parametrize("name", ["a", "A-b_c", "x" * 32, "_lead", "1"])
def test_good_server_names(name):
    assert McpServerSpec(name=name, stdio={"command": "x"}).name == name


def test_env_and_header_names_are_names_not_values():
    with pytest.raises(ValidationError, match="not an environment variable name"):
        McpServerSpec(name="s", stdio={"command": "x", "env_names": ["TOKEN=abc"]})
    with pytest.raises(ValidationError, match="not an environment variable name"):
        McpServerSpec(name="s", http={"url": "http://h/mcp",
                                      "header_env": {"Authorization": "Bearer sk-123"}})
    with pytest.raises(ValidationError, match="not an HTTP header name"):
        McpServerSpec(name="s", http={"url": "http://h/mcp", "header_env": {"Bad Header": "X"}})


def test_url_scheme():
    with pytest.raises(ValidationError, match="http"):
        McpServerSpec(name="s", http={"url": "file:///etc/passwd"})


def test_timeouts_bounded():
    with pytest.raises(ValidationError):
        McpServerSpec(name="s", stdio={"command": "x"}, call_s=0)


def test_namespacing_round_trip_and_no_clash():
    a = namespaced_name("docs", "search")
    b = namespaced_name("wiki", "search")
    assert a == "mcp__docs__search" and a != b
    assert parse_namespaced(a) == ("docs", "search")
    assert parse_namespaced("mcp__docs__multi__part") == ("docs", "multi__part")
    assert parse_namespaced("read_file") is None
    assert parse_namespaced("mcp__docs") is None
    assert parse_namespaced("mcp____x") is None


def test_too_long_name_reported_not_renamed():
    tool = "t" * 120
    problem = namespace_problem("docs", tool)
    assert problem is not None and "128" in problem and tool[:10] in problem
    assert isinstance(make_tool("docs", tool, "d", None), str)


def test_bad_characters_reported():
    problem = namespace_problem("docs", "search.v2")
    assert problem is not None and "characters" in problem
    assert namespace_problem("docs", "") is not None


def test_tool_to_anthropic():
    tool = make_tool("docs", "search_docs", "Search the docs.",
                     {"type": "object", "properties": {"query": {"type": "string"}},
                      "required": ["query"]})
    assert isinstance(tool, McpTool)
    assert tool.to_anthropic() == {
        "name": "mcp__docs__search_docs", "description": "Search the docs.",
        "input_schema": {"type": "object", "properties": {"query": {"type": "string"}},
                         "required": ["query"]}}
    bare = make_tool("docs", "ping", None, None)
    assert isinstance(bare, McpTool)
    assert anthropic_tools([bare]) == [
        {"name": "mcp__docs__ping", "description": "", "input_schema": {"type": "object"}}]


def test_mcp_tool_round_trips_as_json():
    tool = make_tool("docs", "x", "d", {"type": "object"})
    assert isinstance(tool, McpTool)
    assert McpTool.model_validate_json(tool.model_dump_json()) == tool


_server = st.from_regex(r"\A[a-zA-Z0-9_-]{1,32}\Z").filter(
    lambda s: "__" not in s and not s.endswith("_"))
_tool = st.text(st.sampled_from("ab_-Z9."), min_size=0, max_size=130)


@given(_server, _tool)
def test_accepted_names_fit_the_api_and_parse_back(server, tool):
    if namespace_problem(server, tool) is None:
        name = namespaced_name(server, tool)
        assert API_TOOL_NAME_RE.match(name)
        assert parse_namespaced(name) == (server, tool)


def test_url_credentials_refused():
    with pytest.raises(ValidationError, match="credentials"):
        McpServerSpec(name="s", http={"url": "https://user:pw@example.test/mcp"})


def test_non_object_schema_reported():
    problem = make_tool("docs", "t", "d", {"type": "string"})
    assert isinstance(problem, str) and "object" in problem


def test_oversized_schema_reported_and_long_description_cut():
    from schemas.mcp import MAX_DESCRIPTION_CHARS, MAX_SCHEMA_CHARS
    big = {"type": "object", "description": "x" * MAX_SCHEMA_CHARS}
    assert isinstance(make_tool("docs", "t", "", big), str)
    tool = make_tool("docs", "t", "y" * (MAX_DESCRIPTION_CHARS + 10), None)
    assert isinstance(tool, McpTool)
    assert tool.description.endswith("[description cut]")
    assert len(tool.description) < MAX_DESCRIPTION_CHARS + 30


def test_activity_timeout_covers_every_bound():
    spec = McpServerSpec(name="s", stdio={"command": "x"}, connect_s=3, list_s=4, call_s=20)
    assert spec.activity_timeout_s("list") > 3 + 4
    assert spec.activity_timeout_s("call") > 3 + 20


# ----- warm sessions: who may share one --------------------------------------------------

def test_a_warm_session_is_one_keel_sessions_unless_declared_shared():
    spec = McpServerSpec(name="s", stdio={"command": "x"})
    assert (spec.sharing, spec.keep_warm_s, spec.max_warm) == ("session", 300.0, 4)
    assert pool_owner(spec, "session-a") == "session-a"
    assert pool_owner(spec, "") is None  # no owner named: a session of its own
    shared = spec.model_copy(update={"sharing": "shared"})
    assert pool_owner(shared, "session-a") == pool_owner(shared, "session-b") == ""
    assert pool_owner(spec.model_copy(update={"keep_warm_s": 0}), "session-a") is None
    assert pool_owner(shared.model_copy(update={"keep_warm_s": 0}), "x") is None
    with pytest.raises(ValidationError):
        McpServerSpec(name="s", stdio={"command": "x"}, sharing="everyone")
    with pytest.raises(ValidationError):
        McpServerSpec(name="s", stdio={"command": "x"}, max_warm=0)


def test_the_transport_decides_what_is_the_same_server():
    a = McpServerSpec(name="a", stdio={"command": "x", "args": ["1"], "env_names": ["T"]},
                      call_s=5, sharing="shared")
    b = McpServerSpec(name="b", stdio={"command": "x", "args": ["1"], "env_names": ["T"]})
    assert transport_identity(a) == transport_identity(b)  # names, timeouts, pooling aside
    for other in ({"command": "x", "args": ["2"], "env_names": ["T"]},
                  {"command": "x", "args": ["1"], "env_names": ["U"]},
                  {"command": "y", "args": ["1"], "env_names": ["T"]}):
        assert transport_identity(McpServerSpec(name="a", stdio=other)) != \
            transport_identity(a)
    web = McpServerSpec(name="w", http={"url": "http://h/mcp", "header_env": {"K": "T"}})
    assert transport_identity(web) != transport_identity(
        web.model_copy(update={"http": web.http.model_copy(update={"header_env": {"K": "U"}})}))


def test_a_call_activity_has_time_to_keep_its_whole_result():
    spec = McpServerSpec(name="s", stdio={"command": "x"}, connect_s=1, list_s=2, call_s=3)
    assert spec.activity_timeout_s("list") == 1 + 2 + CLOSE_TIMEOUT_S + 5
    assert spec.activity_timeout_s("call") == 1 + 3 + CLOSE_TIMEOUT_S + KEEP_RESULT_S + 5
