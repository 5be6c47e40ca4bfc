"""A worker's warm MCP client sessions: a stdio server's process and an HTTP server's session
kept between activities, so a warm call costs the request, not a process start and a
handshake.

Invariants:
- One pool per worker process, built in workers/worker.py and closed when the workers stop;
  `close()` stops every session it started and waits until each server process is gone.
- Keyed so that nothing is shared that should not be: a warm session is handed only to a
  request whose declaration reaches the server the same way (`schemas.mcp.
  transport_identity`), with the same resolved secret values (compared by digest), and for
  the same owner (`schemas.mcp.pool_owner`: one Keel session, or anyone's for a server
  declared shared). A request with no owner gets a session of its own, closed after it.
- One activity at a time per session (a lease). At most `spec.max_warm` sessions live per
  declaration (transport and secrets) on this worker: a new one first closes the least
  recently used idle one, else waits for one to be released. An idle session is closed
  `spec.keep_warm_s` after its last use.
- A session whose lease ended badly (the server crashed, hung, answered nonsense, or the
  activity was cancelled) is never handed out again: `release(..., healthy=False)` stops it
  and waits for its process. A stdio session whose process died while idle is replaced when
  it is next leased, before any request is sent.
- Each session lives in a task of its own (the SDK's anyio scopes are entered and left in
  one task), started with an empty context (no activity's context outlives it); activities
  only send requests over it.
- Listings are cached per session by server name (`WarmSession.listings`) and dropped when
  the server says its tool list changed (`notifications/tools/list_changed` on a handshake
  connection, a `subscriptions/listen` event on a 2026-07-28 one).
- The mcp SDK is imported when this worker first reaches a server, not when it starts:
  loading it costs about half a second of a core, and most workers' sessions declare no
  server (tests/mcp/test_lazy.py). It is loaded on a thread (`_load_sdk`), so the event
  loop's other activities and workflow tasks go on meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import importlib
import logging
import sys
import time
from collections.abc import Awaitable
from contextlib import AsyncExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

import httpx2  # the anthropic SDK's own HTTP client: loaded with it anyway

from schemas.mcp import CLOSE_TIMEOUT_S, McpServerSpec, transport_identity

if TYPE_CHECKING:
    from activities.mcp_stdio import StdioTransport

__all__ = ["ConnectFailed", "McpPool", "PoolBusy", "PoolClosed", "WarmSession"]

log = logging.getLogger("keel.mcp")


_SDK = ("mcp", "mcp.client.streamable_http", "activities.mcp_stdio")


async def _load_sdk() -> None:
    """Import the SDK's modules this pool uses, off the event loop, the first time only."""
    if _SDK[-1] not in sys.modules:
        await asyncio.to_thread(lambda: [importlib.import_module(m) for m in _SDK])


class ConnectFailed(Exception):
    """Starting or reaching a server failed; `cause` is what the SDK raised."""

    def __init__(self, cause: BaseException, http_status: int | None) -> None:
        super().__init__(str(cause))
        self.cause, self.http_status = cause, http_status


class PoolBusy(Exception):
    """Every warm session of this declaration stayed busy until the deadline."""

    def __init__(self, count: int) -> None:
        super().__init__(f"all {count} of its sessions on this worker are busy")
        self.count = count


class PoolClosed(Exception):
    """The worker is shutting down."""


class HttpTransport:
    """streamable_http_client over our own httpx client: headers from the resolved env,
    timeouts from the spec, and the last HTTP error status kept (the SDK turns a 401 or 500
    into a bare JSON-RPC error), which it closes on exit."""

    alive = True  # a connection has no process to die; a dead server fails the request

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

    def terminate(self) -> None:
        """Nothing to kill: stopping the session closes the connection."""

    async def __aenter__(self) -> Any:
        from mcp.client.streamable_http import streamable_http_client

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


def _transport(spec: McpServerSpec, env: dict[str, str]) -> StdioTransport | HttpTransport:
    if spec.stdio is not None:
        from mcp import StdioServerParameters

        from activities.mcp_stdio import StdioTransport

        # The process gets the SDK's safe default environment (PATH, HOME, …) plus exactly
        # the variables the spec names.
        return StdioTransport(StdioServerParameters(
            command=spec.stdio.command, args=spec.stdio.args,
            env={name: env[name] for name in spec.stdio.env_names}))
    return HttpTransport(spec, env)


def spec_key(spec: McpServerSpec, secrets: dict[str, str]) -> str:
    """The declaration's identity on this worker: its transport and its secrets' digest
    (and, over HTTP, the timeouts its httpx client was built with)."""
    digest = hashlib.sha256(repr(sorted(secrets.items())).encode()).hexdigest()
    timeouts = "" if spec.http is None else \
        f"#{spec.connect_s:g}/{max(spec.list_s, spec.call_s):g}"
    return f"{transport_identity(spec)}#{digest}{timeouts}"


class WarmSession:
    """One client session to one server, run by its own task (`McpPool._run`)."""

    def __init__(self, spec: McpServerSpec, secrets: dict[str, str], key: str,
                 owner: str | None) -> None:
        self.name, self.key, self.owner = spec.name, key, owner
        self.idle_s = spec.keep_warm_s
        self.transport = _transport(spec, secrets)
        from mcp import Client
        from mcp_types import Implementation

        self.client = Client(cast(Any, self.transport), cache=None,
                             client_info=Implementation(name="keel", version="0.1"),
                             message_handler=self._on_message)
        self.listings: dict[str, Any] = {}  # by server name: what the activity made of it
        self.list_changes = 0  # how many times the server said its list changed
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Read by whoever waits on it; when nobody does any more, read here (no warning).
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.stop = asyncio.Event()
        self.wake = asyncio.Event()
        self.busy = True  # the request that starts it holds it
        self.retired = False
        self.reused = False  # this lease is not the session's first
        self.last_used = time.monotonic()
        self.task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        if self.task is None or self.task.done() or self.retired:
            return False
        return self.transport.alive

    @property
    def http_status(self) -> int | None:
        return self.transport.error_status

    def reset_status(self) -> None:
        self.transport.error_status = None

    def changed(self) -> None:
        """The server's tool list changed: no cached listing is served again."""
        self.list_changes += 1
        self.listings.clear()

    async def _on_message(self, message: Any) -> None:
        import mcp_types

        if isinstance(getattr(message, "root", message), mcp_types.ToolListChangedNotification):
            self.changed()

    async def listen(self) -> None:
        """Follow the server's tool-list changes on a 2026-07-28 connection (nothing to do
        on a handshake one: those come as notifications, `_on_message`)."""
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        caps = self.client.server_capabilities.tools
        if self.client.protocol_version not in MODERN_PROTOCOL_VERSIONS \
                or caps is None or not caps.list_changed:
            return
        try:
            async with self.client.listen(tools_list_changed=True) as sub:
                async for _event in sub:
                    self.changed()
        except Exception as err:  # the session still serves requests; listings just age
            log.debug("MCP server %s: no list-changed events (%s)", self.name, err)


class McpPool:
    """The worker's warm MCP sessions (see the module docstring). `keep=False`: every
    request gets a session of its own, closed after it (the activities' behaviour when
    built without a pool)."""

    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self.closed = False
        self._by_key: dict[str, list[WarmSession]] = {}
        self._freed: asyncio.Event | None = None  # set (and replaced) when a slot frees
        self._stopping: set[asyncio.Task[None]] = set()
        self._all: set[WarmSession] = set()

    def _signal(self) -> None:
        if self._freed is not None:
            self._freed.set()
            self._freed = None

    async def _wait_freed(self, timeout: float) -> None:
        if self._freed is None:
            self._freed = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._freed.wait(), timeout)

    def sessions(self) -> list[WarmSession]:
        """Every session the pool holds now (idle, busy or starting)."""
        return [s for group in self._by_key.values() for s in group]

    async def acquire(self, spec: McpServerSpec, secrets: dict[str, str], owner: str | None,
                      *, fresh: bool = False, wait_s: float) -> WarmSession:
        """A session to `spec`'s server, leased to the caller until `release`. `fresh`: not
        one that served before (the caller's earlier sessions of this server are closed).

        Raises `ConnectFailed`, `PoolBusy` (nothing freed within `wait_s`), `PoolClosed`,
        or `TimeoutError` (the server did not complete the handshake within `wait_s`).
        """
        if self.closed:
            raise PoolClosed()
        deadline = time.monotonic() + wait_s
        await _load_sdk()
        if not self.keep or owner is None:
            return await self._ready(self._start(spec, secrets, "", None), deadline)
        key = spec_key(spec, secrets)
        group = self._by_key.setdefault(key, [])
        if fresh:  # the owner's earlier sessions serve no one from now
            for old in [s for s in group if s.owner == owner]:
                if old.busy:
                    self._forget(old)  # its call goes on; `release` then stops it
                else:
                    self._drop(old)
        while True:
            found = self._idle(group, owner)
            if found is not None:
                found.busy, found.reused = True, True
                found.reset_status()
                return found
            if len(group) < spec.max_warm or self._evict(group):
                session = self._start(spec, secrets, key, owner)
                group.append(session)
                return await self._ready(session, deadline)
            left = deadline - time.monotonic()
            if left <= 0:
                raise PoolBusy(len(group))
            await self._wait_freed(left)

    def _idle(self, group: list[WarmSession], owner: str) -> WarmSession | None:
        for session in list(group):
            if session.busy or session.owner != owner:
                continue
            if not session.alive:  # died while idle: replaced, no request lost
                self._drop(session)
                continue
            return session
        return None

    def _evict(self, group: list[WarmSession]) -> bool:
        """Close the least recently used idle session of `group`, if there is one."""
        idle = [s for s in group if not s.busy]
        if not idle:
            return False
        self._drop(min(idle, key=lambda s: s.last_used))
        return True

    def _start(self, spec: McpServerSpec, secrets: dict[str, str], key: str,
               owner: str | None) -> WarmSession:
        session = WarmSession(spec, secrets, key, owner)
        session.task = asyncio.create_task(self._run(session), name=f"mcp-{spec.name}",
                                           context=contextvars.Context())
        self._all.add(session)
        return session

    async def _ready(self, session: WarmSession, deadline: float) -> WarmSession:
        timer = asyncio.timeout(max(0.0, deadline - time.monotonic()))
        try:
            async with timer:
                await asyncio.shield(session.ready)
        except BaseException as err:
            status = session.http_status
            await _shielded(self._stop(session))
            if isinstance(err, Exception) and not timer.expired():
                raise ConnectFailed(err, status) from None
            raise
        return session

    async def _run(self, session: WarmSession) -> None:
        """The session's life: connect, stay open until stopped or idle too long, close."""
        try:
            async with session.client:
                session.ready.set_result(None)
                listener = asyncio.create_task(session.listen())
                try:
                    await self._serve(session)
                finally:
                    listener.cancel()
                    await asyncio.wait({listener})
        except BaseException as err:
            if not session.ready.done():
                session.ready.set_exception(err if isinstance(err, Exception)
                                            else ConnectionError("cancelled while starting"))
            elif not isinstance(err, asyncio.CancelledError):
                log.debug("MCP server %s: session ended: %r", session.name, err)
        finally:
            session.retired = True
            self._forget(session)

    async def _serve(self, session: WarmSession) -> None:
        while not session.stop.is_set():
            timeout: float | None = None
            if not session.busy:
                timeout = session.last_used + session.idle_s - time.monotonic()
                if timeout <= 0 or self.closed:
                    session.retired = True  # idle too long: no lease takes it from now
                    return
            session.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(session.wake.wait(), timeout)

    async def release(self, session: WarmSession, *, healthy: bool) -> None:
        """Give the session back; an unhealthy one, or one nobody may reuse, is stopped
        (and this waits for it)."""
        if healthy and self.keep and session.owner is not None and session.alive \
                and not self.closed and session in self._by_key.get(session.key, []):
            session.busy = False
            session.last_used = time.monotonic()
            session.wake.set()
            self._signal()
            return
        if not healthy:
            session.transport.terminate()  # broken: no polite wait for it to exit
        await _shielded(self._stop(session))

    def _drop(self, session: WarmSession) -> None:
        """Stop `session` in the background (it leaves its group at once)."""
        self._forget(session)
        session.retired = True
        task = asyncio.create_task(self._stop(session), context=contextvars.Context())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _forget(self, session: WarmSession) -> None:
        group = self._by_key.get(session.key)
        if group is not None and session in group:
            group.remove(session)  # an empty group stays: `acquire` may hold it
            self._signal()

    async def _stop(self, session: WarmSession) -> None:
        """Close the session and wait for it, at most CLOSE_TIMEOUT_S (then cancel it)."""
        self._forget(session)
        session.retired = True
        session.stop.set()
        session.wake.set()
        task = session.task
        if task is None or task.done():
            self._all.discard(session)
            return
        if not session.ready.done():
            task.cancel()  # still connecting: nothing to close politely
        done, _ = await asyncio.wait({task}, timeout=CLOSE_TIMEOUT_S)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=CLOSE_TIMEOUT_S)
        self._all.discard(session)

    async def close(self) -> None:
        """Stop every session this pool started; returns when their processes are gone."""
        self.closed = True
        await asyncio.gather(*(self._stop(s) for s in list(self._all)),
                             return_exceptions=True)
        while self._stopping:
            await asyncio.gather(*list(self._stopping), return_exceptions=True)


async def _shielded(work: Awaitable[None]) -> None:
    """Run `work` to its end even if the caller is cancelled meanwhile (the cancel is
    raised after it)."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})
        raise
