"""What one service-tool call and one MCP call cost inside a turn, with the MCP server's
tool listing (once per session) apart from its calls.

Runs on the embedded stack (or the configured one) with the offline model. Each kind (no
tool, one service-tool call, one MCP call: the offline rule calls the tool the instructions
name, then reports) runs N sessions of two turns each, the kinds taking turns session by
session (so a change of the machine's load weighs on all alike); the two turns are timed
apart:
the first turn of an MCP session lists the server's tools (once: they are kept in the
session's state) and calls one; the later turn only calls. Each tool's cost is the
difference of medians against the turn with no tool at the same position, so a first
turn's own set-up is not charged to the tool. The bare activities (the same MCP listing and
call run directly in this process, no Temporal; the service function called directly) are
timed too, so the figure over them is Keel's part.

    python -m bench.bench_agent_tools [N]   -> prints figures, writes bench/results/agent_tools.json
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from temporalio.worker import Worker

from activities.mcp import CallMcpToolInput, ListMcpToolsInput, McpActivities
from bench.common import cancel_on_sigterm, source_commit, table
from examples.support.service import ORDERS, toolset
from keel.client import KeelClient
from keel.devstack import running_stack
from schemas.agent import AgentSpec
from schemas.config import KeelSettings
from schemas.mcp import McpServerSpec, McpStdio
from workers.worker import build_worker

DOCS = str(Path(__file__).resolve().parent.parent / "examples" / "support" / "docs_server.py")


def ms(seconds: list[float]) -> float:
    return round(1000 * statistics.median(seconds), 1)


async def two_turns(keel: KeelClient, spec: AgentSpec) -> tuple[float, float]:
    """One session of two turns: the first turn's time and the later turn's."""
    session = await keel.start_session(f"bench-{uuid.uuid4().hex[:8]}", agent=spec)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        await session.ask("Order A-1001: what is its status?")
        times.append(time.perf_counter() - t0)
    await session.end()
    return times[0], times[1]


async def interleaved(keel: KeelClient, specs: dict[str, AgentSpec], n: int
                      ) -> dict[str, tuple[list[float], list[float]]]:
    """N rounds of one session per kind, the kinds taking turns, so a machine whose load
    changes during the run weighs on every kind alike."""
    out: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in specs}
    for _ in range(n):
        for kind, spec in specs.items():
            first, later = await two_turns(keel, spec)
            out[kind][0].append(first)
            out[kind][1].append(later)
    return out


async def main(n: int) -> None:
    cancel_on_sigterm()
    load_before = os.getloadavg()[0]  # the machine's load, reported with the figures
    data = Path(tempfile.mkdtemp(prefix="keel-bench-tools-"))
    settings = KeelSettings.from_env({"KEEL_DATA_DIR": str(data)})
    docs = McpServerSpec(name="docs", stdio=McpStdio(command=sys.executable, args=[DOCS]))
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
            await interleaved(keel, {"service": service, "mcp": mcp}, 1)  # warm up
            times = await interleaved(keel, {"none": base, "service": service, "mcp": mcp}, n)
    (none_first, none_later), (service_first, service_later), (mcp_first, mcp_later) = (
        times["none"], times["service"], times["mcp"])
    bare_service = []
    for _ in range(n):
        t0 = time.perf_counter()
        _ = dict(ORDERS["A-1001"])
        bare_service.append(time.perf_counter() - t0)
    from temporalio.testing import ActivityEnvironment

    bare_list, bare_call = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        await ActivityEnvironment().run(McpActivities().list_mcp_tools,
                                        ListMcpToolsInput(server=docs))
        bare_list.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await ActivityEnvironment().run(McpActivities().call_mcp_tool, CallMcpToolInput(
            server=docs, tool="search_docs", arguments={"query": "refund"}))
        bare_call.append(time.perf_counter() - t0)

    def over(tool: list[float], none: list[float]) -> float:
        return round(ms(tool) - ms(none), 1)

    figures = {
        "sessions_per_kind": n,
        "first_turn_without_tools_ms": ms(none_first),
        "later_turn_without_tools_ms": ms(none_later),
        "first_turn_with_service_call_ms": ms(service_first),
        "later_turn_with_service_call_ms": ms(service_later),
        "first_turn_with_mcp_server_ms": ms(mcp_first),  # lists once, then calls
        "later_turn_with_mcp_call_ms": ms(mcp_later),  # the same session: calls only
        "service_round_in_later_turn_ms": over(service_later, none_later),
        "mcp_list_and_round_in_first_turn_ms": over(mcp_first, none_first),
        "mcp_round_in_later_turn_ms": over(mcp_later, none_later),
        "bare_service_function_ms": ms(bare_service),
        "bare_mcp_list_ms": ms(bare_list),
        "bare_mcp_call_ms": ms(bare_call),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
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
