"""The budget and interrupt scenarios:

- `history-budget-interrupt`: on the fake Messages API (tests/fake_anthropic, streaming
  slowly), a session budget reached mid-turn (the pause, its notice, a raise, the turn
  finishing), a turn interrupted mid-stream by a message sent with policy `interrupt`, a
  second stopped by the `interrupt` Update, a message refused with policy `reject`, a
  turn budget refused, and the end;
- `history-budget-interrupt-activity`: the same, recorded under the patch
  `interrupt-by-activity` (the stop sent by an ordinary activity, not a local one).
"""

from __future__ import annotations

import asyncio

from keel.client import KeelClient, SessionBusyError, SessionHandle
from schemas.agent import AgentSpec
from schemas.budget import BudgetLimits, BudgetSpec
from schemas.interrupt import InterruptPolicy
from tests.fake_anthropic import FakeAnthropic, text_message, tool_use_message

LONG = " ".join(f"word{n}" for n in range(600))


async def _paused(session: SessionHandle) -> None:
    while (await session.status()).budget_request is None:
        await asyncio.sleep(0.05)


async def _streaming(fake: FakeAnthropic, nth: int) -> None:
    while len(fake.streams) <= nth or fake.streams[nth].events_sent < 4:
        await asyncio.sleep(0.02)


async def budget_scenario(keel: KeelClient, fake: FakeAnthropic,
                          session_id: str) -> SessionHandle:
    write = ("write_file", {"path": "notes.md", "content": "one"})
    fake.push(tool_use_message([write], input_tokens=100_000), text_message("Noted."))
    session = await keel.start_session(session_id, agent=AgentSpec(budget=BudgetSpec(
        session=BudgetLimits(usd=0.2), turn=BudgetLimits(output_tokens=90))))
    first = await session.send("Write the notes.")
    await _paused(session)
    await session.raise_budget(5.0, by="recorder")
    await session.wait_reply(first.seq)
    fake.stream_delay_s = 0.02
    fake.push(text_message(LONG), text_message("One line, as asked."))
    nth = len(fake.streams)
    long = await session.send("Write a long essay.")
    await _streaming(fake, nth)
    try:
        await session.send("Refused while busy.", on_busy=InterruptPolicy.REJECT)
    except SessionBusyError:
        pass
    stop = await session.send("Stop; one line.", on_busy=InterruptPolicy.INTERRUPT)
    await session.wait_reply(long.seq)
    await session.wait_reply(stop.seq)
    fake.push(text_message(LONG))
    nth = len(fake.streams)
    again = await session.send("Another long essay.")
    await _streaming(fake, nth)
    await session.interrupt()
    await session.wait_reply(again.seq)
    fake.stream_delay_s = 0.0
    fake.push(*[tool_use_message([write], input_tokens=10) for _ in range(6)])
    over = await session.send("Write it again and again.")
    await _paused(session)
    await session.refuse_budget(by="recorder", note="enough")
    await session.wait_reply(over.seq)
    await session.end()
    return session
