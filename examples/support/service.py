"""The support service of the example: two tools it serves itself on its own task queue,
`lookup_order` and `refund` (which needs a person's approval), written with Keel's helper.

    python -m examples.support.service --address localhost:7233 --task-queue support-tools

Every refund is appended to `REFUND_LOG` (a JSON line), keyed by Keel's call id, so a
refund asked twice for the same call is paid once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

from pydantic import BaseModel
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from keel.service import ServiceToolCall, ServiceToolset

TASK_QUEUE = "support-tools"
ORDERS = {
    "A-1001": {"order_id": "A-1001", "item": "kettle", "status": "delivered, damaged",
               "amount_cents": 2599, "days_since_purchase": 4},
    "A-1002": {"order_id": "A-1002", "item": "toaster", "status": "in transit",
               "amount_cents": 4100, "days_since_purchase": 1},
}


class Refund(BaseModel):
    order_id: str
    amount_cents: int


def toolset(task_queue: str = TASK_QUEUE) -> ServiceToolset:
    tools = ServiceToolset(task_queue)

    @tools.tool(description="Look up an order by its id (like A-1001).")
    async def lookup_order(order_id: str) -> dict:
        order = ORDERS.get(order_id)
        if order is None:
            return {"error": f"no order {order_id}"}
        return order

    @tools.tool(description="Refund an order, in cents, to the original payment method.",
                approval="ask")
    async def refund(args: Refund, call: ServiceToolCall) -> str:
        log = Path(os.environ.get("REFUND_LOG", "refunds.jsonl"))
        done = {json.loads(line)["call_id"] for line in log.read_text().splitlines()} \
            if log.exists() else set()
        if call.call_id not in done:  # idempotent by Keel's call id
            with log.open("a") as f:
                f.write(json.dumps({"call_id": call.call_id, "session": call.session_id,
                                    **args.model_dump()}) + "\n")
        return (f"Refunded {args.amount_cents / 100:.2f} EUR on order {args.order_id} "
                f"(refund id R-{call.call_id[-6:]}).")

    return tools


async def serve(address: str, task_queue: str, tools: ServiceToolset | None = None) -> None:
    client = await Client.connect(address, data_converter=pydantic_data_converter)
    tools = tools or toolset(task_queue)
    async with Worker(client, task_queue=task_queue, activities=tools.activities()):
        print("service worker ready", flush=True)
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default=os.environ.get("TEMPORAL_ADDRESS",
                                                            "localhost:7233"))
    parser.add_argument("--task-queue", default=TASK_QUEUE)
    args = parser.parse_args()
    asyncio.run(serve(args.address, args.task_queue))


if __name__ == "__main__":
    main()
