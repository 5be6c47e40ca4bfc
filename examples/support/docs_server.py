"""A tiny documentation-search MCP server, built on the mcp package's MCPServer: the support
example's, and the one the tests start (tests/agent, tests/mcp), so there is one copy.

Run over stdio: `python examples/support/docs_server.py`; over streamable HTTP on loopback:
`python examples/support/docs_server.py --http PORT`. With DOCS_REQUIRED_KEY set in its own
environment, the HTTP server answers only requests whose `X-Docs-Key` header equals it (401
otherwise). It never listens anywhere but 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

PARAGRAPHS = [
    "Refund policy: a customer may ask for a refund within 30 days of purchase.",
    "Refunds are paid back to the original payment method within 5 business days.",
    "Shipping: orders leave the warehouse within 2 business days.",
    "Support hours are 9:00 to 17:00 UTC, Monday to Friday.",
    "Accounts: a password reset link is valid for one hour.",
]

server = MCPServer("docs", instructions="Search the product documentation.")


@server.tool()
def search_docs(query: str) -> str:
    """Lines of the documentation that contain every word of the query."""
    words = query.lower().split()
    hits = [p for p in PARAGRAPHS if all(w in p.lower() for w in words)]
    return "\n".join(hits) if hits else f"no documentation matches {query!r}"


@server.tool()
def broken_lookup(topic: str) -> str:
    """Always fails: the tool's own error, reported to the caller as isError."""
    raise ToolError(f"the index for {topic!r} is being rebuilt; try later")


@server.tool()
def env_probe(name: str) -> str:
    """The value of one of the server's environment variables, and its sha256."""
    value = os.environ.get(name)
    if value is None:
        return f"{name} is not set"
    return f"{name}={value} sha256={hashlib.sha256(value.encode()).hexdigest()}"


@server.tool()
def big_output(chars: int) -> str:
    """`chars` characters of text."""
    return "x" * chars


@server.tool()
def structured_count(query: str) -> dict[str, Any]:
    """How many paragraphs mention the query, as structured content."""
    hits = [p for p in PARAGRAPHS if query.lower() in p.lower()]
    return {"query": query, "matches": len(hits)}


@server.tool(name="search.v2")
def search_v2(query: str) -> str:
    """A name with a dot: valid in MCP, refused by the model API once namespaced."""
    return search_docs(query)


class _RequireKey:
    """ASGI wrapper: 401 unless the `X-Docs-Key` header equals `key`."""

    def __init__(self, app: Any, key: str) -> None:
        self.app, self.key = app, key.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"x-docs-key") != self.key:
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"missing or wrong X-Docs-Key"})
            return
        await self.app(scope, receive, send)


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "--http":
        import uvicorn

        app: Any = server.streamable_http_app()
        key = os.environ.get("DOCS_REQUIRED_KEY")
        if key:
            app = _RequireKey(app, key)
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
