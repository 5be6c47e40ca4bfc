"""A reply that is not the whole answer says so: the API's stop reason reaches the caller's
outcome and the turn's end event, and `keel chat` / `send --wait` print a line for a reply
cut at the output limit or declined (before, a cut reply read as the whole answer)."""

from __future__ import annotations

import asyncio
import io
import uuid

from rich.console import Console

from keel.events import session_events
from keel.live import LiveView
from schemas.events import TurnEnded
from schemas.messages import stop_note
from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings


def test_only_stops_that_leave_the_answer_unfinished_have_a_note() -> None:
    for whole in (None, "end_turn", "tool_use", "stop_sequence", "pause_turn"):
        assert stop_note(whole) is None
    assert "output limit" in (stop_note("max_tokens") or "")
    assert "declined" in (stop_note("refusal") or "")


async def test_a_reply_cut_at_the_output_limit_says_so(client, database_url, fake_anthropic,
                                                       tmp_path) -> None:
    fake_anthropic.push(text_message("The three steps are: first, we", stop_reason="max_tokens"),
                        text_message("All done.", stop_reason="end_turn"))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"stop-{uuid.uuid4().hex[:8]}")
        cut = await session.ask("List the three steps.")
        whole = await session.ask("Thanks.")
        assert (cut.stop_reason, whole.stop_reason) == ("max_tokens", "end_turn")
        assert cut.reply_text == "The three steps are: first, we" and cut.error is None
        ended: list[TurnEnded] = []

        async def two_turn_ends() -> None:
            async for _, event in session_events(client, session.session_id, 0):
                if isinstance(event, TurnEnded):
                    ended.append(event)
                    if len(ended) == 2:
                        return

        await asyncio.wait_for(two_turn_ends(), 30)
    assert [e.stop_reason for e in ended] == ["max_tokens", "end_turn"]
    out = io.StringIO()
    view = LiveView(Console(file=out, width=200))
    for offset, event in enumerate(ended):
        view.show(offset, event)
    shown = out.getvalue()
    assert shown.count("the reply stops at the output limit") == 1
