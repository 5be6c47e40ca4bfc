"""`keel chat`'s prompt and the events that reach it (keel.cli.chat, keel.cli.waiting): an
event printed at the prompt comes above it, and the prompt shows again once."""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any, cast

import pytest

import keel.cli.chat as chat_module
from keel.cli.chat import _Chat
from keel.cli.waiting import ChatView
from keel.console import KeelConsole


async def test_an_event_waiting_as_the_prompt_comes_back_is_printed_above_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint's line reaches the chat just as /compact returns to the prompt (its
    event comes by the stream, after the Update's answer): printed before, the view's copy
    of the prompt and then the reading thread's made "you: you: "."""
    out = io.StringIO()
    console = KeelConsole(file=out, width=200, color_system=None)
    monkeypatch.setattr(chat_module, "console", console)

    def typed(*_: object) -> str:
        time.sleep(0.2)  # the person types after the event was shown
        return "  hello  "

    monkeypatch.setattr("builtins.input", typed)
    view = ChatView(console)
    talk = _Chat(cast(Any, None), view)
    asyncio.get_running_loop().call_soon(view._line, "checkpoint stored (full)")
    assert await talk.prompt() == "hello"
    assert out.getvalue() == "you: \ncheckpoint stored (full)\nyou: "
