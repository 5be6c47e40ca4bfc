"""An MCP server that offers many tools, for the window-fit test.

`python tests/mcp/servers/wide_server.py N`: tools `tool_000` .. `tool_{N-1}`, each with a
description of a few hundred characters (what a large real server's tools look like) and
answering with its own name.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from mcp.server.mcpserver import MCPServer

server = MCPServer("wide")
ABOUT = ("Looks up one record of the inventory by its key and returns its fields: the "
         "owner, the location, the last audit, the warranty's end and the notes kept with "
         "it. Use it when the user names an item; it never changes anything. ") * 2


def _answer(name: str) -> Callable[[str], str]:
    def answer(key: str) -> str:
        return f"{name}: {key}"
    return answer


for i in range(int(sys.argv[1])):
    server.add_tool(_answer(f"tool_{i:03}"), name=f"tool_{i:03}", description=ABOUT)

if __name__ == "__main__":
    server.run("stdio")
