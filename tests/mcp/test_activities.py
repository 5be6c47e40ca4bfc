"""MCP activities against real MCP servers (tests/mcp/servers/), over stdio and streamable
HTTP on loopback, in temporalio's ActivityEnvironment: no Temporal server needed."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import socket
import time
from datetime import timedelta

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.mcp import (
    MAX_RESULT_CHARS,
    MCP_UNAVAILABLE,
    CallMcpToolInput,
    ListMcpToolsInput,
    McpActivities,
    McpCallResult,
    McpFailure,
)
from schemas.mcp import McpReach, McpServerSpec
from tests.mcp.conftest import BAD, HTTP_KEY, bad_server_pids, free_port, http_spec, stdio_spec

acts = McpActivities()


def env_with(heartbeat_s: float | None = None) -> tuple[ActivityEnvironment, list]:
    env = ActivityEnvironment()
    beats: list = []
    env.on_heartbeat = lambda *details: beats.append(time.monotonic())
    if heartbeat_s is not None:
        env.info = dataclasses.replace(env.info, heartbeat_timeout=timedelta(seconds=heartbeat_s))
    return env, beats


async def call(spec: McpServerSpec, tool: str, env: ActivityEnvironment | None = None,
               **arguments) -> McpCallResult:
    return await (env or ActivityEnvironment()).run(
        acts.call_mcp_tool, CallMcpToolInput(server=spec, tool=tool, arguments=arguments))


# --- listing -------------------------------------------------------------------------------


async def test_list_over_stdio():
    result = await ActivityEnvironment().run(acts.list_mcp_tools,
                                             ListMcpToolsInput(server=stdio_spec()))
    by_name = {tool.name: tool for tool in result.tools}
    assert "mcp__docs__search_docs" in by_name and "mcp__docs__broken_lookup" in by_name
    search = by_name["mcp__docs__search_docs"]
    assert search.server == "docs" and search.original_name == "search_docs"
    assert search.input_schema["properties"]["query"]["type"] == "string"
    assert search.input_schema["required"] == ["query"]
    assert "documentation" in search.description
    assert search.to_anthropic()["name"] == "mcp__docs__search_docs"
    # a name the model API would refuse is reported, not renamed
    assert not any("search.v2" in tool.name or "search_v2" in tool.name
                   for tool in result.tools)
    assert len(result.problems) == 1 and "'search.v2'" in result.problems[0]


async def test_list_over_http_with_header_from_named_env(docs_http_url, key_env):
    spec = http_spec(docs_http_url, {"X-Docs-Key": "KEEL_TEST_DOCS_KEY"})
    result = await ActivityEnvironment().run(acts.list_mcp_tools, ListMcpToolsInput(server=spec))
    names = {tool.name for tool in result.tools}
    assert {"mcp__web__search_docs", "mcp__web__env_probe"} <= names
    # the secret is in neither the declaration nor the result
    assert HTTP_KEY not in spec.model_dump_json() and HTTP_KEY not in result.model_dump_json()


async def test_http_without_the_header_is_refused(docs_http_url):
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(acts.list_mcp_tools,
                                        ListMcpToolsInput(server=http_spec(docs_http_url)))
    assert info.value.type == MCP_UNAVAILABLE and info.value.non_retryable
    assert info.value.details[0] == McpFailure.UNREACHABLE
    assert "MCP server web refused connect and initialize with HTTP 401" in str(info.value)


async def test_http_wrong_header_value_is_refused_without_echoing_it(docs_http_url,
                                                                    monkeypatch):
    monkeypatch.setenv("KEEL_TEST_DOCS_KEY", "wrong-key-value-123")
    spec = http_spec(docs_http_url, {"X-Docs-Key": "KEEL_TEST_DOCS_KEY"})
    result = await call(spec, "search_docs", query="refund")
    assert result.is_error and "HTTP 401" in result.text
    assert "wrong-key-value-123" not in result.model_dump_json()


async def test_list_server_down_raises_typed_error():
    spec = http_spec(f"http://127.0.0.1:{free_port()}/mcp", connect_s=3)
    started = time.monotonic()
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(acts.list_mcp_tools, ListMcpToolsInput(server=spec))
    assert time.monotonic() - started < 4
    assert info.value.type == MCP_UNAVAILABLE and info.value.non_retryable
    assert info.value.details[0] in (McpFailure.UNREACHABLE, McpFailure.TIMEOUT)
    assert "MCP server web" in str(info.value)


async def test_list_never_initialized_times_out():
    env, beats = env_with(heartbeat_s=0.6)
    started = time.monotonic()
    with pytest.raises(ApplicationError) as info:
        await env.run(acts.list_mcp_tools,
                      ListMcpToolsInput(server=stdio_spec(BAD, name="bad", args=("--no-init",),
                                                          connect_s=1.5)))
    assert time.monotonic() - started < 1.5 + 7  # plus the SDK's bounded process shutdown
    assert info.value.type == MCP_UNAVAILABLE
    assert info.value.details[0] == McpFailure.TIMEOUT
    assert "did not answer connect and initialize within 1.5 s" in str(info.value)
    assert len(beats) >= 3  # heartbeats while it waited


# --- calls ---------------------------------------------------------------------------------


async def test_call_over_stdio():
    result = await call(stdio_spec(), "search_docs", query="refund")
    assert not result.is_error and result.failure is None
    assert "within 30 days" in result.text and "Shipping" not in result.text


async def test_call_over_http(docs_http_url, key_env):
    spec = http_spec(docs_http_url, {"X-Docs-Key": "KEEL_TEST_DOCS_KEY"})
    result = await call(spec, "search_docs", query="support hours")
    assert not result.is_error and "9:00 to 17:00" in result.text


def keyed_http(url: str) -> McpServerSpec:
    return http_spec(url, {"X-Docs-Key": "KEEL_TEST_DOCS_KEY"})


async def test_structured_content_as_json_text(docs_http_url, key_env):
    result = await call(keyed_http(docs_http_url), "structured_count", query="refund")
    assert not result.is_error
    assert result.structured_json is not None and '"matches": 2' in result.structured_json


async def test_tool_error_is_an_error_result():
    result = await call(stdio_spec(), "broken_lookup", topic="billing")
    assert result.is_error and result.failure == McpFailure.TOOL_ERROR
    assert "being rebuilt" in result.text


async def test_unknown_tool_is_an_error_result(docs_http_url, key_env):
    result = await call(keyed_http(docs_http_url), "no_such_tool")
    assert result.is_error and "no_such_tool" in result.text


async def test_crash_mid_call_is_a_clear_error_within_the_timeout():
    started = time.monotonic()
    result = await call(stdio_spec(BAD, name="bad", call_s=5), "crash")
    assert time.monotonic() - started < 5 + 3
    assert result.is_error and result.failure == McpFailure.CRASHED, result
    assert "MCP server bad closed the connection during tools/call crash" in result.text
    assert "session goes on" in result.text
    assert bad_server_pids() == []


async def test_hang_is_an_error_result_within_the_timeout():
    env, beats = env_with(heartbeat_s=0.6)
    started = time.monotonic()
    result = await call(stdio_spec(BAD, name="bad", call_s=1.5), "hang", env)
    # The call's own 1.5 s, plus starting and stopping the server on a busy machine.
    assert time.monotonic() - started < 1.5 + 15
    assert result.is_error and result.failure == McpFailure.TIMEOUT
    assert result.text.startswith("MCP server bad did not answer tools/call hang within 1.5 s")
    assert len(beats) >= 3
    assert bad_server_pids() == []  # the SDK's shutdown killed the hung server


async def test_activity_cancel_propagates_and_stops_the_server():
    env = ActivityEnvironment()
    task = asyncio.create_task(call(stdio_spec(BAD, name="bad", call_s=30), "hang", env))
    deadline = time.monotonic() + 10
    while not bad_server_pids() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # inside the call by now
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    assert bad_server_pids() == []


async def test_stdio_command_missing_is_a_clear_error():
    spec = McpServerSpec(name="ghost", stdio={"command": "/nonexistent/mcp-server"})
    result = await call(spec, "anything")
    assert result.is_error and result.failure == McpFailure.UNREACHABLE
    assert "MCP server ghost could not be started" in result.text


async def test_server_down_is_a_clear_error():
    spec = http_spec(f"http://127.0.0.1:{free_port()}/mcp", connect_s=3)
    started = time.monotonic()
    result = await call(spec, "search_docs", query="x")
    assert time.monotonic() - started < 4
    assert result.is_error and result.failure in (McpFailure.UNREACHABLE, McpFailure.TIMEOUT)
    assert result.text.startswith("MCP server web")


async def test_http_server_that_never_answers_times_out():
    with socket.socket() as listener:  # accepts connections (the kernel does), never replies
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        spec = http_spec(f"http://127.0.0.1:{listener.getsockname()[1]}/mcp", connect_s=1)
        started = time.monotonic()
        result = await call(spec, "search_docs", query="x")
    assert time.monotonic() - started < 1 + 3
    assert result.is_error and result.failure == McpFailure.TIMEOUT
    assert "did not answer connect and initialize within 1 s" in result.text


# --- environment by name -------------------------------------------------------------------


async def test_env_var_passed_by_name_and_blanked_out(monkeypatch):
    secret = "s3cret-value-from-worker"
    monkeypatch.setenv("KEEL_TEST_DOCS_TOKEN", secret)
    monkeypatch.setenv("KEEL_TEST_NOT_PASSED", "not-for-the-server")
    spec = stdio_spec(env_names=("KEEL_TEST_DOCS_TOKEN",))
    result = await call(spec, "env_probe", name="KEEL_TEST_DOCS_TOKEN")
    assert not result.is_error
    # the server saw the value (its hash proves it), the result does not carry it
    assert hashlib.sha256(secret.encode()).hexdigest() in result.text
    assert secret not in result.model_dump_json()
    assert "[$KEEL_TEST_DOCS_TOKEN]" in result.text
    # a variable the spec does not name is not passed on
    other = await call(spec, "env_probe", name="KEEL_TEST_NOT_PASSED")
    assert "KEEL_TEST_NOT_PASSED is not set" in other.text


async def test_missing_env_var_is_named_not_valued(monkeypatch):
    monkeypatch.delenv("KEEL_TEST_ABSENT", raising=False)
    spec = stdio_spec(env_names=("KEEL_TEST_ABSENT",))
    result = await call(spec, "search_docs", query="x")
    assert result.is_error and result.failure == McpFailure.MISSING_ENV
    assert "KEEL_TEST_ABSENT" in result.text
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(acts.list_mcp_tools, ListMcpToolsInput(server=spec))
    assert info.value.details[0] == McpFailure.MISSING_ENV and "KEEL_TEST_ABSENT" in str(
        info.value)


async def test_big_result_is_cut_with_a_note(docs_http_url, key_env):
    result = await call(keyed_http(docs_http_url), "big_output", chars=MAX_RESULT_CHARS + 5000)
    assert result.truncated and not result.is_error
    assert len(result.text) < MAX_RESULT_CHARS + 200
    assert f"[result cut at {MAX_RESULT_CHARS} of {MAX_RESULT_CHARS + 5000} characters]" in (
        result.text)


# --- payloads ------------------------------------------------------------------------------


def test_contracts_round_trip_through_the_data_converter(monkeypatch):
    from temporalio.contrib.pydantic import pydantic_data_converter

    monkeypatch.setenv("KEEL_TEST_DOCS_KEY", HTTP_KEY)
    converter = pydantic_data_converter.payload_converter
    spec = http_spec("http://127.0.0.1:1/mcp", {"X-Docs-Key": "KEEL_TEST_DOCS_KEY"})
    values = [CallMcpToolInput(server=spec, tool="search_docs", arguments={"query": "q"}),
              ListMcpToolsInput(server=spec),
              McpCallResult(text="t", is_error=True, failure=McpFailure.TIMEOUT)]
    payloads = converter.to_payloads(values)
    assert all(HTTP_KEY.encode() not in p.data for p in payloads)
    back = converter.from_payloads(payloads, [type(v) for v in values])
    assert back == values


# --- what a worker reaches ------------------------------------------------------------------


async def test_a_worker_starts_only_the_stdio_commands_it_lists(tmp_path):
    """KEEL_MCP_STDIO_COMMANDS: a command outside the list is never started (the spec's
    author would run any program on the worker's host); listed, it runs as before."""
    import sys

    marker = tmp_path / "ran"
    other = McpServerSpec.model_validate({  # a command of the spec author's choosing
        "name": "other", "stdio": {"command": "/bin/sh", "args": ["-c", f"touch {marker}"]},
        "connect_s": 5, "list_s": 5, "call_s": 5})
    only_python = McpActivities(reach=McpReach(stdio_commands=(sys.executable,)))
    listed = await ActivityEnvironment().run(only_python.list_mcp_tools,
                                             ListMcpToolsInput(server=stdio_spec()))
    assert any(t.name == "mcp__docs__search_docs" for t in listed.tools)
    for worker, says in ((only_python, "runs a command this worker does not reach"),
                         (McpActivities(reach=McpReach(stdio_commands=())),
                          "reaches none of that kind (KEEL_MCP_STDIO_COMMANDS=none)")):
        with pytest.raises(ApplicationError) as info:
            await ActivityEnvironment().run(worker.list_mcp_tools,
                                            ListMcpToolsInput(server=other))
        assert info.value.details[0] == McpFailure.REFUSED and says in str(info.value)
        result = await ActivityEnvironment().run(worker.call_mcp_tool, CallMcpToolInput(
            server=other, tool="search_docs", arguments={"query": "x"}))
        assert result.is_error and result.failure == McpFailure.REFUSED
    assert not marker.exists()  # nothing was started


async def test_a_worker_reaches_only_the_http_hosts_it_lists(docs_http_url, key_env):
    """KEEL_MCP_HTTP_HOSTS: a URL outside the list (a cloud's metadata address, a database
    port on the worker's own network) is never requested; listed, it is reached."""
    spec = keyed_http(docs_http_url)  # on 127.0.0.1
    for hosts in (("127.0.0.1",), ("127.0.0.*", "docs.example.com")):
        allowed = McpActivities(reach=McpReach(http_hosts=hosts))
        assert not (await ActivityEnvironment().run(allowed.call_mcp_tool, CallMcpToolInput(
            server=spec, tool="search_docs", arguments={"query": "x"}))).is_error
    for hosts, says in ((("docs.example.com",), "is at a host this worker does not reach"),
                        ((), "KEEL_MCP_HTTP_HOSTS=none")):
        refused = McpActivities(reach=McpReach(http_hosts=hosts))
        result = await ActivityEnvironment().run(refused.call_mcp_tool, CallMcpToolInput(
            server=spec, tool="search_docs", arguments={"query": "x"}))
        assert result.is_error and result.failure == McpFailure.REFUSED
        assert says in result.text


@pytest.mark.parametrize("name", ["ANTHROPIC_API_KEY", "DATABASE_URL",
                                  "KEEL_PROVIDER_FAST_API_KEY"])
async def test_a_worker_never_hands_its_own_credentials_to_a_server(monkeypatch, name,
                                                                    docs_http_url):
    """A spec may name any variable, but not Keel's own credentials: they would go to a
    command or a URL of the spec author's choosing."""
    secret = "sk-ant-the-workers-own-key"
    monkeypatch.setenv(name, secret)
    for spec in (stdio_spec(env_names=(name,)),
                 http_spec(docs_http_url, header_env={"X-Api-Key": name})):
        result = await call(spec, "env_probe", name=name)
        assert result.is_error and result.failure == McpFailure.REFUSED, result
        assert f"names {name}, Keel's own" in result.text and secret not in result.text
