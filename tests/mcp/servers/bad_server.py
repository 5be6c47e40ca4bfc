"""MCP servers that misbehave, for tests, built on the mcp package's MCPServer (stdio).

`python tests/mcp/servers/bad_server.py`: tools `crash` (the process exits mid-call),
`hang` (never answers), `ok` (answers). With `--no-init` the server never completes the
initialize handshake: its lifespan never finishes starting.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from mcp.server.mcpserver import MCPServer


@asynccontextmanager
async def _stuck_lifespan(_: MCPServer) -> AsyncIterator[None]:
    await anyio.sleep_forever()
    yield


server = MCPServer("bad", lifespan=_stuck_lifespan if "--no-init" in sys.argv else None)


@server.tool()
def crash(reason: str = "") -> str:
    """Kills the server process in the middle of the call."""
    sys.stderr.write(f"bad_server: crashing on purpose {reason}\n")
    sys.stderr.flush()
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never returns."""
    await anyio.sleep_forever()
    return "unreachable"


@server.tool()
def ok() -> str:
    """Answers at once."""
    return "fine"


if __name__ == "__main__":
    server.run("stdio")
