"""The page's files (keel.ui.views): each file a message carried is linked by its place in
the record, and a tool's images are shown under the call whose result they are."""

from __future__ import annotations

from keel.record import RecordEntry
from keel.ui.views import ShownFile, conversation


def _file(name: str, media_type: str) -> dict[str, object]:
    return {"name": name, "path": f"attachments/x/{name}", "media_type": media_type,
            "size": 10, "sha256": "0" * 64, "tokens": 5}


def test_a_messages_files_and_a_tools_images_are_linked_where_they_are_shown():
    rows = [
        RecordEntry(seq=1, type="user", source_line=None, text="look", token_count=9,
                    content={"attachments": [_file("a.png", "image/png"),
                                             _file("b.pdf", "application/pdf")]}),
        RecordEntry(seq=2, type="assistant", source_line=None, text="", token_count=9,
                    content=[{"type": "tool_use", "id": "t1", "name": "mcp__web__shot",
                              "input": {}}]),
        RecordEntry(seq=3, type="tool_result", source_line=None, text="the page",
                    token_count=9, content={"tool_use_id": "t1", "is_error": False,
                                            "attachments": [_file("shot.png", "image/png")]}),
    ]
    shown = conversation(rows)
    assert [m.seq for m in shown] == [1, 2]
    assert shown[0].files == [ShownFile(1, 0, "a.png", "image/png"),
                              ShownFile(1, 1, "b.pdf", "application/pdf")]
    assert [f.is_image for f in shown[0].files] == [True, False]
    assert shown[1].tools[0].result_files == [ShownFile(3, 0, "shot.png", "image/png")]
