"""An MCP server that shows what a warm session keeps, for the pool's tests and benchmark.

`python tests/mcp/servers/pool_server.py`: tools
- `whoami`: this process's id (a warm session answers with the same one);
- `remember(text)` / `recall`: what this process was told (state a caller leaves behind);
- `timed(ms)`: sleeps `ms` milliseconds and says how long its own handler took, so a
  caller can tell the server's time from the client's;
- `add_tool(name, announce)`: offers one more tool, and with `announce` says so (the
  list-changed notification of either protocol era);
- `big(chars)`: `chars` characters of text (no structured copy);
- `crash`: the process exits mid-call; `hang`: never answers.
"""

from __future__ import annotations

import json
import os
import sys
import time

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("pool")
told: list[str] = []


@server.tool()
def whoami() -> str:
    """This server process's id."""
    return str(os.getpid())


@server.tool()
def remember(text: str) -> str:
    """Keep `text` in this process."""
    told.append(text)
    return f"kept {len(told)}"


@server.tool()
def recall() -> str:
    """Everything this process was told, one per line."""
    return "\n".join(told) or "nothing"


@server.tool(structured_output=False)
async def timed(ms: int = 0) -> str:
    """Sleep `ms` milliseconds; answer with the handler's own duration."""
    started = time.perf_counter()
    if ms:
        await anyio.sleep(ms / 1000)
    return json.dumps({"pid": os.getpid(),
                       "server_ms": (time.perf_counter() - started) * 1000})


@server.tool()
async def add_tool(name: str, ctx: Context, announce: bool = True) -> str:
    """Offer one more tool named `name` (it echoes its text)."""

    def echo(text: str) -> str:
        return text

    server.add_tool(echo, name=name, description=f"echo, added as {name}")
    if announce:
        await ctx.notify_tools_changed()  # subscriptions/listen (2026-07-28)
        try:
            await ctx.session.send_tool_list_changed()  # a handshake-era connection
        except Exception as err:  # the other era's way may not exist on this connection
            sys.stderr.write(f"pool_server: no legacy notification ({err})\n")
    return f"added {name}"


@server.tool(structured_output=False)
def big(chars: int) -> str:
    """`chars` characters of text."""
    return "y" * chars


@server.tool()
def crash() -> str:
    """Kills the server process in the middle of the call."""
    os._exit(3)


@server.tool()
async def hang() -> str:
    """Never returns."""
    await anyio.sleep_forever()
    return "unreachable"


if __name__ == "__main__":
    server.run("stdio")
