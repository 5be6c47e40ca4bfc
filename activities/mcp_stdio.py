"""A stdio transport for MCP servers whose reading is linear in a message's size.

The mcp package's `stdio_client` reads the server's stdout as `(buffer + chunk).split("\\n")`
per 64 KiB chunk: a message of n bytes costs O(n²) (16 MB took 8 s of CPU, 64 MB 143 s on
this machine). This transport is that one function with the reader changed: a line's chunks
are kept in a list and joined once, at its newline. Spawning, the pipes' writer and the
shutdown (close stdin, 2 s, SIGTERM to the process group, 2 s, SIGKILL; shielded, every wait
bounded) are the SDK's own helpers, called as they are (`mcp>=2.3,<3` pins them; an import
error here says at once that they moved).

Invariants:
- Every line of the server's stdout becomes exactly one message (or parse error) on the
  read stream, in order; a last line without a newline is dropped, as the SDK does.
- The process started is stopped when the context exits, however it exits (the SDK's
  shielded shutdown), and `process` is set from the spawn until then, so an owner can see
  whether the server is still alive (`alive`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

import anyio
import anyio.lowlevel
from anyio.streams.text import TextReceiveStream
from mcp.client.stdio import (
    _WRITER_FLUSH_TIMEOUT,
    StdioServerParameters,
    _aclose_all,
    _create_platform_compatible_process,
    _drain_stdout,
    _get_executable_command,
    _parse_line,
    _stop_server_process,
    get_default_environment,
)
from mcp.shared.message import SessionMessage

__all__ = ["StdioTransport"]

log = logging.getLogger(__name__)


class StdioTransport:
    """`Client(StdioTransport(params))`: one server process for one client session."""

    error_status: int | None = None  # an HTTP transport's last error; a pipe has none

    def __init__(self, params: StdioServerParameters, errlog: TextIO = sys.stderr) -> None:
        self.params, self.errlog = params, errlog
        self.process: object | None = None
        self._cm = self._run()

    @property
    def alive(self) -> bool:
        """Whether the server process was started and has not exited."""
        return self.process is not None and getattr(self.process, "returncode", 0) is None

    def terminate(self) -> None:
        """SIGTERM to the server's process group now (a server being discarded after a
        crash, hang or cancel need not be given the polite 2 s); the SDK's shutdown then
        finds it gone, or escalates as usual."""
        if not self.alive:
            return
        pid = getattr(self.process, "pid", None)
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            if sys.platform == "win32":  # pragma: no cover
                self.process.terminate()  # type: ignore[union-attr]
            else:
                os.killpg(pid, signal.SIGTERM)  # its own group: start_new_session

    async def __aenter__(self) -> object:
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc: object) -> bool | None:
        return await self._cm.__aexit__(*exc)  # type: ignore[arg-type]

    @asynccontextmanager
    async def _run(self) -> AsyncIterator[object]:
        server = self.params
        command = await _get_executable_command(server.command)
        process = await _create_platform_compatible_process(
            command=command, args=server.args,
            env=get_default_environment() | (server.env or {}), errlog=self.errlog,
            cwd=server.cwd)
        self.process = process
        # No awaits until the task group is entered (a cancellation in the gap would leak
        # the live process), as in the SDK.
        read_writer, read_stream = anyio.create_memory_object_stream[
            SessionMessage | Exception](0)
        write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
        stopping = anyio.Event()
        writer_done = anyio.Event()

        async def shutdown() -> None:
            read_stream.close()
            write_stream.close()
            with anyio.move_on_after(_WRITER_FLUSH_TIMEOUT) as flush:
                await writer_done.wait()
            if flush.cancelled_caught:
                await anyio.lowlevel.cancel_shielded_checkpoint()
            await _stop_server_process(process)
            await _aclose_all(read_stream, write_stream, read_writer, write_reader)
            await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            tg.start_soon(_read_lines, process, server, read_writer, stopping)
            tg.start_soon(_write_messages, process, server, write_reader, read_writer,
                          writer_done)
            try:
                yield read_stream, write_stream
            finally:
                stopping.set()
                with anyio.CancelScope(shield=True):
                    await shutdown()
                tg.cancel_scope.cancel()
        await anyio.lowlevel.cancel_shielded_checkpoint()


async def _read_lines(process: Any, server: StdioServerParameters, out: Any,
                      stopping: anyio.Event) -> None:
    """Every line of the server's stdout as a message on `out`: a line's chunks are kept
    in a list and joined once, at its newline (linear in the line's length)."""
    assert process.stdout
    stdout = TextReceiveStream(process.stdout, encoding=server.encoding,
                               errors=server.encoding_error_handler)
    try:
        async with out:
            try:
                pending: list[str] = []  # the current line's chunks
                async for chunk in stdout:
                    start = 0
                    while (end := chunk.find("\n", start)) != -1:
                        pending.append(chunk[start:end])
                        line = "".join(pending)
                        pending.clear()
                        start = end + 1
                        try:
                            await out.send(_parse_line(line))
                        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                            return  # the session is gone; only the drain below remains
                    if start < len(chunk):
                        pending.append(chunk[start:])
            finally:
                await _drain_stdout(process)
    except anyio.ClosedResourceError:
        pass  # our own shutdown closed the stream under the read
    except (anyio.BrokenResourceError, ConnectionError):
        if not stopping.is_set():
            log.exception("reading the MCP server's stdout failed mid-session")


async def _write_messages(process: Any, server: StdioServerParameters, messages: Any,
                          reads: Any, done: anyio.Event) -> None:
    """Each message from the session onto the server's stdin, one JSON line each; a broken
    pipe closes the read side too, so no request waits forever."""
    assert process.stdin
    try:
        async with messages:
            async for message in messages:
                json = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await process.stdin.send((json + "\n").encode(
                    encoding=server.encoding, errors=server.encoding_error_handler))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        await reads.aclose()
    finally:
        done.set()
