"""An input as the live view says it (keel.live.LiveView, `keel tail`): a message's files
named after it; a background input by its source line."""

from __future__ import annotations

import io

from rich.console import Console

from keel.live import LiveView
from schemas.events import InputRecorded

AT = "2026-12-07T07:00:00Z"


def test_a_message_is_said_with_the_files_it_carried() -> None:
    out = io.StringIO()
    view = LiveView(Console(file=out, width=200, color_system=None))
    view.show(0, InputRecorded.model_validate({
        "session_id": "s", "at": AT, "turn": 1, "kind": "user", "seq": 4,
        "files": ["screen.png", "q3.pdf"]}))
    view.show(1, InputRecorded.model_validate({
        "session_id": "s", "at": AT, "turn": 1, "kind": "user", "seq": 5}))
    assert out.getvalue().splitlines() == ["user input #4 with screen.png, q3.pdf",
                                           "user input #5"]
