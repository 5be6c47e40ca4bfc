"""An event as the live relay sends it to a session page (keel.ui.live.ShownDeltas): its
text shown as the pages show text, a reply's deltas still adding up, by the page's own
rule (`body = body.slice(0, start) + text`), to the reply as shown. Pure: no server."""

from __future__ import annotations

from itertools import pairwise

from keel.ui.live import ShownDeltas
from schemas.events import TextDelta, ToolCalled
from schemas.text import visible

AT = "2026-12-07T22:30:00Z"
REPLY = "Approve \u202etxt.exe\u202c now?\x1b]52;c;aGk=\x1b\\ done \u2066x\u2069."


def _delta(text: str, start: int, index: int, attempt: int = 1) -> TextDelta:
    return TextDelta.model_validate({"session_id": "s", "at": AT, "turn": 1, "reply_seq": 4,
                                     "attempt": attempt, "index": index, "start": start,
                                     "text": text})


def _page(events: list[dict]) -> str:
    body = ""
    for e in events:  # keel/ui/static/live.js, text_delta
        if e["start"] == 0 and e["index"] == 0:
            body = ""
        body = body[:e["start"]] + e["text"]
    return body


def test_a_reply_s_deltas_add_up_to_the_reply_as_shown() -> None:
    relay = ShownDeltas()
    cuts = [0, 9, 17, 25, 33, len(REPLY)]
    sent = [relay.shown(i, _delta(REPLY[a:b], a, i)) for i, (a, b) in
            enumerate(pairwise(cuts))]
    assert _page(sent) == visible(REPLY)
    assert not any(c in _page(sent) for c in "\u202e\u202c\u2066\u2069\x1b")
    # A new attempt starts the reply over, shown the same way.
    again = relay.shown(9, _delta(REPLY, 0, 0, attempt=2))
    assert _page([*sent, again]) == visible(REPLY)


def test_every_string_of_an_event_is_shown() -> None:
    called = ToolCalled.model_validate({"session_id": "s", "at": AT, "turn": 1,
                                        "tool_use_id": "t1", "name": "deploy",
                                        "input": '{"path": "\u202egnp.exe"}'})
    data = ShownDeltas().shown(3, called)
    assert data["offset"] == 3 and data["input"] == '{"path": "<U+202E>gnp.exe"}'
