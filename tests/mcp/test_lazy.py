"""A worker loads the mcp SDK when it first reaches a server, not when it starts (about half
a second of a core a process; most sessions declare no server), on a thread while its event
loop goes on, and everything the SDK does for it works from that first reach on, in a
fresh process where nothing loaded it before: a listing and a call over stdio, an MCP error
put into words, a listing over HTTP.

The probe runs in its own interpreter: this test process loads the SDK for its servers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.mcp.conftest import DOCS, HTTP_KEY

ROOT = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent("""
    import asyncio, os, sys
    import workers.main, workers.worker, activities.mcp, activities.mcp_pool

    def sdk():
        return sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types'))

    assert not sdk(), sdk()
    from temporalio.testing import ActivityEnvironment
    from activities.mcp import CallMcpToolInput, ListMcpToolsInput, McpActivities
    from activities.mcp_pool import McpPool
    from schemas.mcp import McpServerSpec

    docs, url = sys.argv[1], sys.argv[2]
    stdio = McpServerSpec.model_validate({
        "name": "docs", "stdio": {"command": sys.executable, "args": [docs]},
        "connect_s": 15, "list_s": 15, "call_s": 10})
    web = McpServerSpec.model_validate({
        "name": "web", "http": {"url": url, "header_env": {"X-Docs-Key": "DOCS_KEY"}},
        "connect_s": 15, "list_s": 15, "call_s": 10})

    async def main():
        pool = McpPool()
        acts = McpActivities(pool)
        env = ActivityEnvironment()
        loop, gaps = asyncio.get_running_loop(), [0.0]

        async def tick():  # the event loop's longest stall while the SDK loads
            while True:
                before = loop.time()
                await asyncio.sleep(0.005)
                gaps.append(loop.time() - before - 0.005)

        ticker = asyncio.create_task(tick())
        try:
            listed = await env.run(acts.list_mcp_tools,
                                   ListMcpToolsInput(server=stdio, session_id="s1"))
            ticker.cancel()
            print("stdio tools", len(listed.tools))
            print("longest stall", round(max(gaps), 3))
            found = await env.run(acts.call_mcp_tool, CallMcpToolInput(
                server=stdio, tool="search_docs", arguments={"query": "retry"},
                session_id="s1"))
            print("call error", found.is_error)
            bad = await env.run(acts.call_mcp_tool, CallMcpToolInput(
                server=stdio, tool="no_such_tool", arguments={}, session_id="s1"))
            print("unknown tool", bad.is_error, bad.text[:200].replace(chr(10), " "))
            over_http = await env.run(acts.list_mcp_tools,
                                      ListMcpToolsInput(server=web, session_id="s1"))
            print("http tools", len(over_http.tools))
        finally:
            await pool.close()

    asyncio.run(main())
""")


def test_the_sdk_loads_at_the_first_server_reached_and_serves_from_there(docs_http_url):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, DOCS, docs_http_url], capture_output=True, text=True,
        timeout=120, cwd=ROOT, env={"PATH": "/usr/bin:/bin", "DOCS_KEY": HTTP_KEY})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.rsplit(" ", 1) if not line.startswith("unknown tool") else
                 ("unknown tool", line[len("unknown tool "):])
                 for line in done.stdout.splitlines())
    assert int(lines["stdio tools"]) >= 2 and int(lines["http tools"]) >= 2
    # The SDK loads on a thread: the loop's other work goes on (~14 ms at most here, ~460
    # ms with the import on the loop).
    assert float(lines["longest stall"]) < 0.25, lines["longest stall"]
    assert lines["call error"] == "False"
    # The server's error for a tool it does not have, put into words from the lazily
    # loaded SDK's error class: a failed result, the session still serving.
    assert lines["unknown tool"].startswith("True ") and "no_such_tool" in lines["unknown tool"]
