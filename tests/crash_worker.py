"""`python -m tests.crash_worker`: a Keel worker that SIGKILLs itself once, right after
the body of activity `KEEL_CRASH_AT` returns and before its completion reaches Temporal
(the write is done, the answer is lost). `KEEL_CRASH_MARK` is the file that says it has
happened, so the worker that takes over runs the retry normally."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from schemas.config import KeelSettings
from workers.worker import build_worker


class _Crash(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        result = await self.next.execute_activity(input)
        mark = Path(os.environ["KEEL_CRASH_MARK"])
        if activity.info().activity_type == os.environ["KEEL_CRASH_AT"] and not mark.exists():
            mark.write_text(activity.info().activity_type)
            os.kill(os.getpid(), signal.SIGKILL)
        return result


class CrashInterceptor(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Crash(next)


async def main() -> None:
    settings = KeelSettings.from_env()
    assert settings.temporal_address
    client = await Client.connect(settings.temporal_address,
                                  data_converter=pydantic_data_converter)
    async with build_worker(client, settings, interceptors=[CrashInterceptor()]):
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
