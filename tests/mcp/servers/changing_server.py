"""An MCP server whose tool list is read from a file at start, for the refresh test.

`python tests/mcp/servers/changing_server.py TOOLS_FILE`: serves `alpha` always, and `beta`
too once TOOLS_FILE holds the word "beta". The file is read when the process starts, so a
listing shows the file as it was then: a refresh lists on a new session (a new process)
and sees the file's newest words; a warm session's listing does not.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

TOOLS_FILE = Path(sys.argv[1])
server = MCPServer("changing")


@server.tool()
def alpha(text: str) -> str:
    """Echo the text back."""
    return f"alpha: {text}"


if "beta" in TOOLS_FILE.read_text():
    @server.tool()
    def beta(text: str) -> str:
        """Echo the text back, louder."""
        return f"BETA: {text.upper()}"


if __name__ == "__main__":
    server.run("stdio")
