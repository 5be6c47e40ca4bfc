"""What the tests that watch a stream share: a reply long enough to be still streaming when
the test acts (`LONG`, at `DELAY_S` an event), a wait until the fake API's stream has sent
so many events (`streaming`), and a reader of a session's own event stream in the
background (`Reader`)."""

from __future__ import annotations

import asyncio
from typing import Any

from keel.client import KeelClient
from schemas.events import EventType
from tests.fake_anthropic import FakeAnthropic

LONG = " ".join(f"word{n}" for n in range(300))  # 100 events: 5 s at 50 ms an event
DELAY_S = 0.05
TIMEOUT = 90


async def streaming(fake: FakeAnthropic, events: int = 5, nth: int = 0) -> None:
    """Until the `nth` stream has sent `events` events."""
    for _ in range(400):
        if len(fake.streams) > nth and fake.streams[nth].events_sent >= events:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the reply never streamed")


class Reader:
    """A subscriber in the background, keeping every (offset, event)."""

    def __init__(self, keel: KeelClient, session_id: str, after: int = 0) -> None:
        self.items: list[tuple[int, Any]] = []
        self.task = asyncio.create_task(self._run(keel, session_id, after))

    async def _run(self, keel: KeelClient, session_id: str, after: int) -> None:
        async for pair in keel.session(session_id).events(after=after):
            self.items.append(pair)

    def of(self, *types: EventType) -> list[Any]:
        return [e for _, e in self.items if getattr(e, "type", None) in types]

    async def until(self, predicate: Any) -> None:
        async with asyncio.timeout(TIMEOUT):
            while not predicate(self):
                await asyncio.sleep(0.05)

    def stop(self) -> None:
        self.task.cancel()
