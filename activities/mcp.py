"""MCP tools as activities: list a server's tools, call one tool.

Invariants:
- Stateless: each activity opens its own client session to the server (a fresh process for
  stdio), does its one thing and closes it; nothing is kept between activities.
- Bounded: starting/reaching the server and the handshake take at most `spec.connect_s`, the
  listing `spec.list_s`, the call `spec.call_s`; the activity heartbeats while it waits.
- A call never raises for the server's sake: the tool's own error, and a server that is down,
  hangs, crashes or speaks nonsense, all come back as an `is_error=True` result whose text
  says what happened, so the session goes on. A listing that fails raises a non-retryable
  `ApplicationError(type="McpUnavailable")` for the workflow to record.
- No secret leaves the worker: environment values are read here, by the names the spec
  gives, and every resolved value is blanked out of any text this module returns or raises.
  A missing variable is reported by its name only.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from enum import StrEnum
from types import TracebackType
from typing import Any, TypeVar

import httpx2
import mcp_types
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import with_heartbeat
from schemas.mcp import CLOSE_TIMEOUT_S, McpServerSpec, McpTool, make_tool

# --- contracts -----------------------------------------------------------------------------


class McpFailure(StrEnum):
    """What went wrong, for the workflow to branch on (never on text)."""

    TOOL_ERROR = "tool_error"  # the tool ran and said it failed (isError)
    MISSING_ENV = "missing_env"  # a variable the spec names is not set on this worker
    TIMEOUT = "timeout"  # the server did not answer in time
    UNREACHABLE = "unreachable"  # could not start the process / connect to the URL
    CRASHED = "crashed"  # the connection closed under a request
    PROTOCOL = "protocol"  # the server answered with an MCP error or something unreadable


MCP_UNAVAILABLE = "McpUnavailable"  # ApplicationError.type of a failed listing


class ListMcpToolsInput(BaseModel):
    server: McpServerSpec


class ListMcpToolsResult(BaseModel):
    server: str
    tools: list[McpTool] = Field(default_factory=list)
    # Tools left out, each with its reason (a name the model API would refuse, a duplicate).
    problems: list[str] = Field(default_factory=list)
    server_version: str = ""


class CallMcpToolInput(BaseModel):
    server: McpServerSpec
    tool: str  # the server's own name for it, not the namespaced one
    arguments: dict[str, Any] = Field(default_factory=dict)


class McpCallResult(BaseModel):
    text: str
    is_error: bool = False
    failure: McpFailure | None = None  # set whenever is_error is
    structured_json: str | None = None  # the tool's structured content, as JSON text
    truncated: bool = False


# --- limits --------------------------------------------------------------------------------

MAX_RESULT_CHARS = 100_000
MAX_LIST_PAGES = 50
MAX_TOOLS = 500
MAX_PROBLEMS = 50
MIN_SECRET_CHARS = 4  # shorter values are not blanked out (they would blank ordinary text)

_T = TypeVar("_T")


class _Fault(Exception):
    """A failure already put into words for the model and the workflow."""

    def __init__(self, kind: McpFailure, text: str) -> None:
        super().__init__(text)
        self.kind = kind
        self.text = text


def _seconds(value: float) -> str:
    return f"{value:g} s"


def resolve_env(spec: McpServerSpec) -> dict[str, str]:
    """name → value for every variable the spec names, read from this worker's environment."""
    values: dict[str, str] = {}
    missing = [name for name in spec.env_names() if name not in os.environ]
    if missing:
        raise _Fault(McpFailure.MISSING_ENV,
                     f"MCP server {spec.name} needs environment variable(s) "
                     f"{', '.join(missing)}, not set on this worker; the session goes on "
                     "without it")
    for name in spec.env_names():
        values[name] = os.environ[name]
    return values


def scrub(text: str, secrets: dict[str, str]) -> str:
    """`text` with every resolved value replaced by `[$NAME]`, longest first."""
    for name, value in sorted(secrets.items(), key=lambda kv: -len(kv[1])):
        if len(value) >= MIN_SECRET_CHARS:
            text = text.replace(value, f"[${name}]")
    return text


def _transport(spec: McpServerSpec, env: dict[str, str]) -> Any:
    if spec.stdio is not None:
        # The process gets the SDK's safe default environment (PATH, HOME, …) plus exactly
        # the variables the spec names.
        params = StdioServerParameters(command=spec.stdio.command, args=spec.stdio.args,
                                       env={name: env[name] for name in spec.stdio.env_names})
        return stdio_client(params)
    assert spec.http is not None
    return _HttpTransport(spec, env)


class _HttpTransport:
    """streamable_http_client over our own httpx client: headers from the resolved env,
    timeouts from the spec, and the last HTTP error status kept (the SDK turns a 401 or 500
    into a bare JSON-RPC error), which it closes on exit."""

    def __init__(self, spec: McpServerSpec, env: dict[str, str]) -> None:
        assert spec.http is not None
        self.url = spec.http.url
        self.error_status: int | None = None
        headers = {header: env[name] for header, name in spec.http.header_env.items()}
        self._http = httpx2.AsyncClient(
            headers=headers,
            timeout=httpx2.Timeout(spec.connect_s, read=max(spec.list_s, spec.call_s)),
            event_hooks={"response": [self._note_status]})
        self._stack = AsyncExitStack()

    async def _note_status(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            self.error_status = response.status_code

    async def __aenter__(self) -> Any:
        await self._stack.enter_async_context(self._http)
        try:
            return await self._stack.enter_async_context(
                streamable_http_client(self.url, http_client=self._http))
        except BaseException:
            await self._stack.aclose()
            raise

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        return await self._stack.__aexit__(exc_type, exc, tb)


_HTTP_HINT = {401: "not authorized: check the header variables this worker sends",
              403: "forbidden: check the header variables this worker sends",
              404: "no MCP endpoint at that URL"}


def _leaf(err: BaseException) -> BaseException:
    """The first non-group exception inside task-group wrapping."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


def _describe(spec: McpServerSpec, step: str, err: BaseException,
              http_status: int | None = None) -> _Fault:
    """Put a failure during `step` into words."""
    err = _leaf(err)
    where = f"MCP server {spec.name}"
    tail = "; the session goes on without it"
    if isinstance(err, _Fault):
        return err
    if isinstance(err, MCPError) and http_status is not None:
        return _Fault(McpFailure.UNREACHABLE if http_status in (401, 403, 404)
                      else McpFailure.PROTOCOL,
                      f"{where} refused {step} with HTTP {http_status} "
                      f"({_HTTP_HINT.get(http_status, err.message)}){tail}")
    if isinstance(err, MCPError):
        if err.code == mcp_types.CONNECTION_CLOSED:
            return _Fault(McpFailure.CRASHED,
                          f"{where} closed the connection during {step} (the server may have "
                          f"crashed or exited){tail}")
        return _Fault(McpFailure.PROTOCOL,
                      f"{where} answered {step} with an MCP error ({err.code}): "
                      f"{err.message}{tail}")
    if isinstance(err, FileNotFoundError | PermissionError):
        return _Fault(McpFailure.UNREACHABLE,
                      f"{where} could not be started ({type(err).__name__}: {err}){tail}")
    if isinstance(err, httpx2.TimeoutException | TimeoutError):
        return _Fault(McpFailure.TIMEOUT, f"{where} did not answer {step} in time{tail}")
    if isinstance(err, httpx2.TransportError | ConnectionError):
        return _Fault(McpFailure.UNREACHABLE,
                      f"{where} could not be reached during {step} "
                      f"({type(err).__name__}: {err}){tail}")
    if isinstance(err, OSError):
        return _Fault(McpFailure.UNREACHABLE,
                      f"{where} failed during {step} ({type(err).__name__}: {err}){tail}")
    return _Fault(McpFailure.PROTOCOL,
                  f"{where} failed during {step} ({type(err).__name__}: {err}){tail}")


async def with_server(spec: McpServerSpec, secrets: dict[str, str], step: str,
                      step_timeout: float, work: Callable[[Client], Awaitable[_T]]) -> _T:
    """Open a session to the server, run `work` on it within `step_timeout`, close it; the
    activity heartbeats all along, the close included (activities.heartbeat).

    `secrets` is `resolve_env(spec)`. Every failure comes out as a `_Fault` whose text holds
    no resolved secret.
    """
    return await with_heartbeat(_in_session(spec, secrets, step, step_timeout, work))


async def _in_session(spec: McpServerSpec, secrets: dict[str, str], step: str,
                      step_timeout: float, work: Callable[[Client], Awaitable[_T]]) -> _T:
    stack = AsyncExitStack()
    phase, limit = "connect and initialize", spec.connect_s
    transport: Any = None
    try:
        transport = _transport(spec, secrets)
        client = Client(transport, cache=None,
                        client_info=mcp_types.Implementation(name="keel", version="0.1"))
        async with asyncio.timeout(limit):
            await stack.enter_async_context(client)
        phase, limit = step, step_timeout
        async with asyncio.timeout(limit):
            return await work(client)
    except TimeoutError:
        raise _Fault(McpFailure.TIMEOUT,
                     f"MCP server {spec.name} did not answer {phase} within "
                     f"{_seconds(limit)}; the session goes on without it") from None
    except Exception as err:
        status = transport.error_status if isinstance(transport, _HttpTransport) else None
        raise _scrubbed(_describe(spec, phase, err, status), secrets) from None
    finally:
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await stack.aclose()
        except Exception as err:  # closing a broken connection: nothing left to tell
            activity.logger.debug("closing MCP server %s: %s", spec.name,
                                  scrub(repr(_leaf(err)), secrets))


def _scrubbed(fault: _Fault, secrets: dict[str, str]) -> _Fault:
    return _Fault(fault.kind, scrub(fault.text, secrets))


def _cut(text: str) -> tuple[str, bool]:
    if len(text) <= MAX_RESULT_CHARS:
        return text, False
    return (text[:MAX_RESULT_CHARS]
            + f"\n[result cut at {MAX_RESULT_CHARS} of {len(text)} characters]", True)


def _content_text(blocks: list[Any]) -> str:
    parts: list[str] = []
    for block in blocks:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} content ({block.mime_type}) not shown]")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(text if text is not None else f"[binary resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {block.uri}]")
        else:
            parts.append(f"[{kind or 'unknown'} content not shown]")
    return "\n".join(parts)


def call_result(result: mcp_types.CallToolResult, secrets: dict[str, str]) -> McpCallResult:
    text, truncated = _cut(scrub(_content_text(list(result.content)), secrets))
    structured: str | None = None
    if result.structured_content is not None:
        structured = scrub(json.dumps(result.structured_content, ensure_ascii=False,
                                      default=str), secrets)
        if len(structured) > MAX_RESULT_CHARS:
            structured, truncated = None, True
            text += f"\n[structured content dropped: over {MAX_RESULT_CHARS} characters]"
    if not text and structured is not None:
        text = structured
    if result.is_error:
        return McpCallResult(text=text or "the tool reported an error without a message",
                             is_error=True, failure=McpFailure.TOOL_ERROR,
                             structured_json=structured, truncated=truncated)
    return McpCallResult(text=text, structured_json=structured, truncated=truncated)


class McpActivities:
    """The worker's MCP activities. Holds nothing between calls."""

    @activity.defn
    async def list_mcp_tools(self, data: ListMcpToolsInput) -> ListMcpToolsResult:
        spec = data.server

        secrets: dict[str, str] = {}

        async def work(client: Client) -> ListMcpToolsResult:
            out = ListMcpToolsResult(server=spec.name,
                                     server_version=getattr(client.server_info, "version", "")
                                     or "")
            problems: list[str] = []
            seen: set[str] = set()
            cursor: str | None = None
            for _ in range(MAX_LIST_PAGES):
                page = await client.list_tools(cursor=cursor)
                for tool in page.tools:
                    shown = repr(tool.name[:80])
                    made = make_tool(spec.name, tool.name, tool.description, tool.input_schema)
                    if isinstance(made, str):
                        problems.append(made)
                    elif made.name in seen:
                        problems.append(f"tool {shown} of server {spec.name!r} is listed "
                                        "twice; the first is kept")
                    elif len(out.tools) >= MAX_TOOLS:
                        problems.append(f"tool {shown} left out: over {MAX_TOOLS} tools")
                    else:
                        seen.add(made.name)
                        made.description = scrub(made.description, secrets)
                        out.tools.append(made)
                cursor = page.next_cursor
                if cursor is None:
                    break
            else:
                problems.append(f"listing stopped after {MAX_LIST_PAGES} pages")
            if len(problems) > MAX_PROBLEMS:
                problems[MAX_PROBLEMS:] = [f"… and {len(problems) - MAX_PROBLEMS} more"]
            out.problems = [scrub(problem, secrets) for problem in problems]
            return out

        try:
            secrets.update(resolve_env(spec))
            return await with_server(spec, secrets, "tools/list", spec.list_s, work)
        except _Fault as fault:
            raise ApplicationError(fault.text, fault.kind.value, type=MCP_UNAVAILABLE,
                                   non_retryable=True) from None

    @activity.defn
    async def call_mcp_tool(self, data: CallMcpToolInput) -> McpCallResult:
        spec = data.server
        secrets: dict[str, str] = {}

        async def work(client: Client) -> McpCallResult:
            result = await client.call_tool(data.tool, data.arguments)
            return call_result(result, secrets)

        try:
            secrets.update(resolve_env(spec))
            return await with_server(spec, secrets, f"tools/call {data.tool}", spec.call_s,
                                     work)
        except _Fault as fault:
            return McpCallResult(text=fault.text, is_error=True, failure=fault.kind)
