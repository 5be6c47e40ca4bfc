"""The test service's worker, run as its own process: the example's tools plus tools that
misbehave (`explode` raises, `slow` outlives its timeout, `huge` returns more than its
cap) and `chart`, whose result carries files (an image, a PDF, text, and an image too wide
for the model). `python -m tests.agent.service_worker ADDRESS TASK_QUEUE`."""

from __future__ import annotations

import asyncio
import sys

from examples.support.service import serve, toolset
from keel.service import ServiceToolResult, ServiceToolset, ToolFile
from tests.attached import image, pdf


def misbehaving_toolset(task_queue: str) -> ServiceToolset:
    tools = toolset(task_queue)

    @tools.tool(description="Always raises.")
    async def explode(reason: str) -> str:
        raise RuntimeError(f"the warehouse API is down ({reason})")

    @tools.tool(description="Sleeps longer than its timeout.", timeout_s=1.0)
    async def slow(seconds: int) -> str:
        await asyncio.sleep(seconds)
        return "woke up"

    @tools.tool(description="Returns a lot of text.", output_cap_chars=500)
    async def huge(size: int) -> str:
        return "x" * size

    @tools.tool(description="Draws the day's orders as a chart, with its data sheet.")
    async def chart(width: int, height: int) -> ServiceToolResult:
        return ServiceToolResult(text=f"orders chart {width}x{height}", files=[
            ToolFile(name="orders.png", data=image(width, height)),
            ToolFile(name="sheet.pdf", data=pdf(2)),
            ToolFile(name="../notes.txt", data=b"12 orders, 3 late\n"),
            ToolFile(name="panorama.png", data=image(9000, 10))])

    return tools


if __name__ == "__main__":
    address, queue = sys.argv[1], sys.argv[2]
    asyncio.run(serve(address, queue, misbehaving_toolset(queue)))
