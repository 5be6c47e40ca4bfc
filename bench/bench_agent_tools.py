"""What one service-tool call and one MCP call cost inside a turn.

Runs on the embedded stack (or the configured one) with the offline model. For each kind it
times N turns whose agent makes exactly one call of that tool (offline rule: call the tool
the instructions name, then report), and N turns with no tool at all; the difference of the
medians is the cost of one tool round inside a turn (the call as a Temporal activity, its
result recorded, one more model request). The bare call (the same function or MCP call run
directly in this process, no Temporal) is timed too, so the figure over it is Keel's part.

    python -m bench.bench_agent_tools [N]   -> prints figures, writes bench/results/agent_tools.json
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from temporalio.worker import Worker

from activities.mcp import CallMcpToolInput, McpActivities
from bench.common import source_commit, table
from examples.support.service import ORDERS, toolset
from keel.client import KeelClient
from keel.devstack import running_stack
from schemas.agent import AgentSpec
from schemas.config import KeelSettings
from schemas.mcp import McpServerSpec
from workers.worker import build_worker

DOCS = str(Path(__file__).resolve().parent.parent / "examples" / "support" / "docs_server.py")


def ms(seconds: list[float]) -> float:
    return round(1000 * statistics.median(seconds), 1)


async def timed_turns(keel: KeelClient, spec: AgentSpec, n: int) -> list[float]:
    out = []
    for _ in range(n):
        session = await keel.start_session(f"bench-{uuid.uuid4().hex[:8]}", agent=spec)
        t0 = time.perf_counter()
        await session.ask("Order A-1001: what is its status?")
        out.append(time.perf_counter() - t0)
        await session.end()
    return out


async def main(n: int) -> None:
    data = Path(tempfile.mkdtemp(prefix="keel-bench-tools-"))
    settings = KeelSettings.from_env({"KEEL_DATA_DIR": str(data)})
    docs = McpServerSpec(name="docs", stdio={"command": sys.executable, "args": [DOCS]})
    async with running_stack(settings) as stack:
        settings = settings.model_copy(update={"database_url": stack.database_url})
        tools = toolset("bench-tools")
        lookup = [t for t in tools.declarations() if t.name == "lookup_order"]
        async with build_worker(stack.client, settings), Worker(
                stack.client, task_queue="bench-tools", activities=tools.activities()):
            keel = KeelClient(stack.client, settings.task_queue, settings)
            base = AgentSpec(instructions="Answer briefly.")
            service = AgentSpec(instructions="Call lookup_order.", tools=lookup)
            mcp = AgentSpec(instructions="Call search_docs.", mcp_servers=[docs])
            await timed_turns(keel, service, 2)  # warm up
            none_t = await timed_turns(keel, base, n)
            service_t = await timed_turns(keel, service, n)
            mcp_t = await timed_turns(keel, mcp, n)
    bare_service = []
    for _ in range(n):
        t0 = time.perf_counter()
        _ = dict(ORDERS["A-1001"])
        bare_service.append(time.perf_counter() - t0)
    bare_mcp = []
    from temporalio.testing import ActivityEnvironment

    for _ in range(n):
        t0 = time.perf_counter()
        await ActivityEnvironment().run(McpActivities().call_mcp_tool, CallMcpToolInput(
            server=docs, tool="search_docs", arguments={"query": "refund"}))
        bare_mcp.append(time.perf_counter() - t0)
    figures = {
        "turns_per_kind": n,
        "turn_without_tools_ms": ms(none_t),
        "turn_with_service_call_ms": ms(service_t),
        "turn_with_mcp_call_ms": ms(mcp_t),
        "service_round_in_turn_ms": round(ms(service_t) - ms(none_t), 1),
        "mcp_round_in_turn_ms": round(ms(mcp_t) - ms(none_t), 1),
        "bare_service_function_ms": ms(bare_service),
        "bare_mcp_call_ms": ms(bare_mcp),
        "source_commit": source_commit(),
    }
    print(table("one tool round inside a turn (median ms, offline model)",
                ["figure", "ms"], [[k, v] for k, v in figures.items()
                                   if k.endswith("_ms")]))
    out = Path(__file__).resolve().parent / "results" / "agent_tools.json"
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 15))
