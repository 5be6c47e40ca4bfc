"""MCP tools as activities: list a server's tools, call one tool.

Invariants:
- Warm: each activity leases a client session from the worker's pool (activities.mcp_pool),
  which keeps it for the next activity of the same owner (`schemas.mcp.pool_owner`); a
  session whose lease ended badly is stopped, never reused. Built without a pool, each
  activity opens its own session and closes it.
- Bounded: getting a session (waiting for a free one, starting the server, the handshake)
  takes at most `spec.connect_s`, the listing `spec.list_s`, the call `spec.call_s`, and
  keeping a call's whole result `KEEP_RESULT_S`; the activity heartbeats while it waits.
- A call never raises for the server's sake: the tool's own error, and a server that is down,
  hangs, crashes or speaks nonsense, all come back as an `is_error=True` result whose text
  says what happened, so the session goes on. A listing that fails raises a non-retryable
  `ApplicationError(type="McpUnavailable")` for the workflow to record.
- A result over the caller's cap (`CallMcpToolInput.cap_chars`) never crosses Temporal
  whole: its whole text goes into the session's workspace here, at
  `.keel/results/<call id>.txt` (written once per call id, as `activities.files` does), and
  the result carries the text cut to the cap with a line saying where the rest is
  (`whole_result`). When the workspace refuses it, the cut text fits the cap and says so.
- No secret leaves the worker: environment values are read here, by the names the spec
  gives, and every resolved value is blanked out of any text this module returns or raises.
  A missing variable is reported by its name only.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

import httpx2
from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.attachments import keep_images
from activities.files import kept_result_path
from activities.heartbeat import with_heartbeat
from activities.mcp_pool import ConnectFailed, McpPool, PoolBusy, PoolClosed, WarmSession
from activities.tools import workspace_path
from activities.workspace import WorkspaceStore
from schemas.agent import DEFAULT_OUTPUT_CAP_CHARS, cut_result
from schemas.mcp import (
    KEEP_RESULT_S,
    McpReach,
    McpServerSpec,
    McpTool,
    make_tool,
    pool_owner,
    worker_problem,
)

if TYPE_CHECKING:  # the SDK loads with the first server reached (activities.mcp_pool)
    import mcp_types

# --- contracts -----------------------------------------------------------------------------


class McpFailure(StrEnum):
    """What went wrong, for the workflow to branch on (never on text)."""

    TOOL_ERROR = "tool_error"  # the tool ran and said it failed (isError)
    MISSING_ENV = "missing_env"  # a variable the spec names is not set on this worker
    TIMEOUT = "timeout"  # the server did not answer in time
    UNREACHABLE = "unreachable"  # could not start the process / connect to the URL
    CRASHED = "crashed"  # the connection closed under a request
    PROTOCOL = "protocol"  # the server answered with an MCP error or something unreadable
    REFUSED = "refused"  # this worker does not reach it (schemas.mcp.worker_problem)


MCP_UNAVAILABLE = "McpUnavailable"  # ApplicationError.type of a failed listing


class ListMcpToolsInput(BaseModel):
    server: McpServerSpec
    session_id: str = ""  # the Keel session it is for: whose warm sessions it may use
    refresh: bool = False  # list on a new session, not from a warm one's cache


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
    session_id: str = ""  # whose warm sessions it may use, and whose workspace keeps a result
    call_id: str = ""  # the model's tool_use id: where a result over the cap is kept
    cap_chars: int = Field(default=DEFAULT_OUTPUT_CAP_CHARS, ge=100)


class McpCallResult(BaseModel):
    text: str
    is_error: bool = False
    failure: McpFailure | None = None  # set whenever is_error is
    structured_json: str | None = None  # the tool's structured content, as JSON text
    truncated: bool = False
    # The workspace path of the whole text, when `text` is cut to the input's cap.
    whole_result: str | None = None
    # The images the tool returned, put in the workspace (schemas.attachments.upload_path):
    # the record reads them there and sends them with the result.
    images: list[str] = Field(default_factory=list)


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
    from mcp import MCPError
    from mcp_types import CONNECTION_CLOSED

    if isinstance(err, MCPError) and http_status is not None:
        return _Fault(McpFailure.UNREACHABLE if http_status in (401, 403, 404)
                      else McpFailure.PROTOCOL,
                      f"{where} refused {step} with HTTP {http_status} "
                      f"({_HTTP_HINT.get(http_status, err.message)}){tail}")
    if isinstance(err, MCPError):
        if err.code == CONNECTION_CLOSED:
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


async def with_server(pool: McpPool, spec: McpServerSpec, secrets: dict[str, str],
                      owner: str | None, step: str, step_timeout: float,
                      work: Callable[[WarmSession], Awaitable[_T]], *,
                      fresh: bool = False) -> _T:
    """Lease a session to the server from `pool`, run `work` on it within `step_timeout`,
    give it back (stopped when anything went wrong); the activity heartbeats all along.

    `secrets` is `resolve_env(spec)`. Every failure comes out as a `_Fault` whose text holds
    no resolved secret. A reused session that fails in a way a new one would not (its HTTP
    session expired, a listing on a server that went away) is tried once more on a new one.
    """
    try:
        return await with_heartbeat(_in_session(pool, spec, secrets, owner, step,
                                                step_timeout, work, fresh=fresh))
    except _Retry as retry:
        activity.logger.info("MCP server %s: a warm session failed (%s); a new one",
                             spec.name, retry.fault.kind.value)
        return await with_heartbeat(_in_session(pool, spec, secrets, owner, step,
                                                step_timeout, work, fresh=True))


class _Retry(Exception):
    def __init__(self, fault: _Fault) -> None:
        self.fault = fault


def _healthy_after(err: BaseException) -> bool:
    """Whether a session that raised `err` may serve again: only when the server answered
    with an ordinary MCP error (an unknown tool, bad arguments), never after a broken
    connection, a timeout or a reply that could not be read."""
    from mcp import MCPError
    from mcp_types import CONNECTION_CLOSED

    leaf = _leaf(err)
    return isinstance(leaf, MCPError) and leaf.code != CONNECTION_CLOSED


async def _in_session(pool: McpPool, spec: McpServerSpec, secrets: dict[str, str],
                      owner: str | None, step: str, step_timeout: float,
                      work: Callable[[WarmSession], Awaitable[_T]], *, fresh: bool) -> _T:
    phase, limit = "connect and initialize", spec.connect_s
    session: WarmSession | None = None
    healthy = False
    try:
        # Bounded by the pool itself: a free session, or a new one's handshake, in `limit`.
        session = await pool.acquire(spec, secrets, owner, fresh=fresh, wait_s=limit)
        phase, limit = step, step_timeout
        async with asyncio.timeout(limit):
            result = await work(session)
        healthy = True
        return result
    except TimeoutError:
        raise _Fault(McpFailure.TIMEOUT,
                     f"MCP server {spec.name} did not answer {phase} within "
                     f"{_seconds(limit)}; the session goes on without it") from None
    except PoolBusy as busy:
        raise _Fault(McpFailure.TIMEOUT,
                     f"MCP server {spec.name}: {busy} and none was free within "
                     f"{_seconds(limit)}; the session goes on without it") from None
    except PoolClosed:
        raise _Fault(McpFailure.UNREACHABLE,
                     f"MCP server {spec.name}: this worker is shutting down; the session "
                     "goes on without it") from None
    except ConnectFailed as failed:
        raise _scrubbed(_describe(spec, phase, failed.cause, failed.http_status),
                        secrets) from None
    except Exception as err:
        status = session.http_status if session is not None else None
        healthy = _healthy_after(err) and status is None
        fault = _scrubbed(_describe(spec, phase, err, status), secrets)
        if session is not None and session.reused and _worth_retrying(fault, session, step):
            raise _Retry(fault) from None
        raise fault from None
    finally:
        if session is not None:
            await pool.release(session, healthy=healthy)


def _worth_retrying(fault: _Fault, session: WarmSession, step: str) -> bool:
    """A reused session's failure a new session would not have: an expired HTTP session
    (404), or, for a listing (which changes nothing), a connection that had gone."""
    if session.http_status == 404:
        return True
    return step == "tools/list" and fault.kind in (McpFailure.CRASHED, McpFailure.UNREACHABLE)


def _scrubbed(fault: _Fault, secrets: dict[str, str]) -> _Fault:
    return _Fault(fault.kind, scrub(fault.text, secrets))


def _content_text(blocks: list[Any], images_kept: bool = False) -> str:
    parts: list[str] = []
    for block in blocks:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "image" and images_kept:
            continue  # sent with the result, named by its line (`keep_images`)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} content ({block.mime_type}) not shown]")
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            if text is None and images_kept:
                continue  # sent with the result, named by its line (`keep_images`)
            parts.append(text if text is not None else f"[binary resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource link: {block.uri}]")
        else:
            parts.append(f"[{kind or 'unknown'} content not shown]")
    return "\n".join(parts)


def result_parts(result: mcp_types.CallToolResult, secrets: dict[str, str],
                 images_kept: bool = False) -> tuple[str, str | None, str]:
    """(whole text, structured content as JSON or None, a note to add after the text) of a
    call's result, secrets blanked; its images left out of the text when `images_kept`.
    The text is the structured JSON when the tool gave no text; a structured part over
    MAX_RESULT_CHARS is dropped, and the note says so."""
    text = scrub(_content_text(list(result.content), images_kept), secrets)
    structured: str | None = None
    note = ""
    if result.structured_content is not None:
        structured = scrub(json.dumps(result.structured_content, ensure_ascii=False,
                                      default=str), secrets)
        if not text:
            text = structured
        if len(structured) > MAX_RESULT_CHARS:
            structured = None
            note = f"\n[structured content dropped: over {MAX_RESULT_CHARS} characters]"
    if result.is_error and not text:
        text = "the tool reported an error without a message"
    return text, structured, note


def _cut(text: str) -> tuple[str, bool]:
    if len(text) <= MAX_RESULT_CHARS:
        return text, False
    return (text[:MAX_RESULT_CHARS]
            + f"\n[result cut at {MAX_RESULT_CHARS} of {len(text)} characters]", True)


def call_result(result: mcp_types.CallToolResult, secrets: dict[str, str]) -> McpCallResult:
    """The result as a caller that keeps nothing gets it: cut at MAX_RESULT_CHARS."""
    whole, structured, note = result_parts(result, secrets)
    text, truncated = _cut(whole)
    return _result(result.is_error, text + note, structured, truncated or bool(note))


def _result(is_error: bool | None, text: str, structured: str | None, truncated: bool,
            whole_result: str | None = None) -> McpCallResult:
    if is_error:
        return McpCallResult(text=text, is_error=True, failure=McpFailure.TOOL_ERROR,
                             structured_json=structured, truncated=truncated,
                             whole_result=whole_result)
    return McpCallResult(text=text, structured_json=structured, truncated=truncated,
                         whole_result=whole_result)


def unkept_cut(text: str, cap: int, why: str) -> str:
    """`text` cut so that it and the line saying why the rest is lost fit in `cap`."""
    tail = (f" of {len(text)} characters; the whole result could not be kept: "
            f"{why[:300]}]")
    shown = max(0, cap - len(tail) - 40)
    return f"{text[:shown]}\n[result cut at {shown}{tail}"


class McpActivities:
    """The worker's MCP activities, over the worker's pool of warm sessions (`pool`; none:
    a session per activity) and its workspace store (`store`, for whole results; none: a
    result is cut at MAX_RESULT_CHARS and the workflow keeps what it gets)."""

    def __init__(self, pool: McpPool | None = None,
                 store: Callable[[], WorkspaceStore] | None = None,
                 reach: McpReach | None = None) -> None:
        self.pool = pool if pool is not None else McpPool(keep=False)
        self.store = store
        # What the worker's settings let it start or request (workers.worker builds it).
        self.reach = reach or McpReach()

    def _resolve(self, spec: McpServerSpec) -> dict[str, str]:
        """The spec's variables, once this worker has agreed to reach its server."""
        if problem := worker_problem(spec, self.reach):
            raise _Fault(McpFailure.REFUSED, f"{problem}; the session goes on without it")
        return resolve_env(spec)

    @activity.defn
    async def list_mcp_tools(self, data: ListMcpToolsInput) -> ListMcpToolsResult:
        spec = data.server
        secrets: dict[str, str] = {}

        async def work(session: WarmSession) -> ListMcpToolsResult:
            cached = None if data.refresh else session.listings.get(spec.name)
            if cached is not None:
                return cached.model_copy(deep=True)
            changes = session.list_changes
            out = await _listing(spec, session, secrets)
            if session.list_changes == changes:  # no change announced meanwhile
                session.listings[spec.name] = out.model_copy(deep=True)
            return out

        try:
            secrets.update(self._resolve(spec))
            return await with_server(self.pool, spec, secrets,
                                     pool_owner(spec, data.session_id), "tools/list",
                                     spec.list_s, work, fresh=data.refresh)
        except _Fault as fault:
            raise ApplicationError(fault.text, fault.kind.value, type=MCP_UNAVAILABLE,
                                   non_retryable=True) from None

    @activity.defn
    async def call_mcp_tool(self, data: CallMcpToolInput) -> McpCallResult:
        spec = data.server
        secrets: dict[str, str] = {}

        async def work(session: WarmSession) -> mcp_types.CallToolResult:
            return await session.client.call_tool(data.tool, data.arguments)

        try:
            secrets.update(self._resolve(spec))
            result = await with_server(self.pool, spec, secrets,
                                       pool_owner(spec, data.session_id),
                                       f"tools/call {data.tool}", spec.call_s, work)
        except _Fault as fault:
            return McpCallResult(text=fault.text, is_error=True, failure=fault.kind)
        if self.store is None or not data.session_id or not data.call_id:
            return call_result(result, secrets)
        images, said = await keep_images(self.store(), data.session_id, data.call_id,
                                         data.tool, list(result.content))
        whole, structured, note = result_parts(result, secrets, images_kept=True)
        whole = "\n".join(part for part in (whole, *said) if part)
        cap = data.cap_chars
        if len(whole) + len(note) <= cap:
            out = _result(result.is_error, whole + note, structured, bool(note))
            out.images = images
            return out
        try:
            path = await with_heartbeat(asyncio.wait_for(self._keep(data, whole),
                                                         KEEP_RESULT_S))
        except Exception as err:  # the store's refusal, or it is down: the call stands
            why = "the workspace did not answer in time" if isinstance(err, TimeoutError) \
                else str(err) or type(err).__name__
            activity.logger.warning("whole result of %s not kept: %s", data.call_id, why)
            out = _result(result.is_error, unkept_cut(whole, cap - len(note), why) + note,
                          structured, True)
            out.images = images
            return out
        text, _ = cut_result(whole, cap,
                             f"the whole result is in {path}; read it with read_file")
        out = _result(result.is_error, text + note, structured, True, whole_result=path)
        out.images = images
        return out

    async def _keep(self, data: CallMcpToolInput, whole: str) -> str:
        """The whole text at `.keel/results/<call id>.txt`, under the op id the workflow's
        own keeping uses (activities.files.keep_tool_result): written once per call."""
        assert self.store is not None
        path = kept_result_path(workspace_path(data.call_id.replace("/", "_")))
        await self.store().write(data.session_id, path, whole.encode(errors="replace"),
                                 op_id=f"result-{data.call_id}")
        return path


async def _listing(spec: McpServerSpec, session: WarmSession,
                   secrets: dict[str, str]) -> ListMcpToolsResult:
    client = session.client
    out = ListMcpToolsResult(server=spec.name,
                             server_version=getattr(client.server_info, "version", "") or "")
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
                problems.append(f"tool {shown} of server {spec.name!r} is listed twice; "
                                "the first is kept")
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

