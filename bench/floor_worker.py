"""`python -m bench.floor_worker`: the floor's worker process (`bench/floor.py`'s workflow).

Configured from the environment: TEMPORAL_ADDRESS, FLOOR_TASK_QUEUE, ANTHROPIC_BASE_URL.
The one activity sends a message through the `anthropic` SDK to the same fake Messages API
Keel's turn talks to: a minimal request, or, when its argument names a JSON file, that
request (the benchmark writes Keel's own last request there, outside the timed call), so the
model's side can cost both the same. The worker uses Temporal's defaults: the sandboxed
workflow runner and the default data converter.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import anthropic
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from bench.floor import FLOOR_ACTIVITY, FloorWorkflow

MINIMAL = "minimal"
_SDK: list[anthropic.AsyncAnthropic] = []


def request_body(request: str) -> dict[str, Any]:
    if request == MINIMAL:
        return {"model": "fake-model", "max_tokens": 64,
                "messages": [{"role": "user", "content": "hi"}]}
    body: dict[str, Any] = json.loads(Path(request).read_text())
    return body


@activity.defn(name=FLOOR_ACTIVITY)
async def floor_model_call(request: str) -> str:
    body = request_body(request)
    sdk = _SDK[0]
    if body.pop("stream", False):  # Keel streamed it: so does the floor, to the final message
        async with sdk.messages.stream(**body) as stream:
            message = await stream.get_final_message()
    else:
        message = await sdk.messages.create(**body)
    return "".join(getattr(b, "text", "") for b in message.content)


async def main() -> None:
    _SDK.append(anthropic.AsyncAnthropic(base_url=os.environ["ANTHROPIC_BASE_URL"],
                                         api_key="x", max_retries=0))
    client = await Client.connect(os.environ["TEMPORAL_ADDRESS"])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Worker(client, task_queue=os.environ["FLOOR_TASK_QUEUE"],
                      workflows=[FloorWorkflow], activities=[floor_model_call]):
        await stop.wait()
    await _SDK[0].close()


if __name__ == "__main__":
    asyncio.run(main())
