from schemas.checkpoint.policy import thrashing
from schemas.checkpoint.prepass import IMAGE_TOKENS, prepass
from schemas.messages import MessageType, RecordRow
from schemas.tokens import count_tokens


def row(seq, kind, text, content=None):
    return RecordRow(seq=seq, type=kind, text=text, content=content,
                     token_count=count_tokens(text))


BIG = "\n".join(f"line {i}: " + "data " * 20 for i in range(40))


def test_old_tool_results_shrink_to_one_line_and_recent_ones_stay():
    rows = [row(1, MessageType.USER, "go"),
            row(2, MessageType.TOOL_RESULT, BIG, {"tool_use_id": "t1", "is_error": False}),
            row(3, MessageType.TOOL_RESULT, "tiny", {"tool_use_id": "t2"}),
            row(4, MessageType.TOOL_RESULT, BIG + " recent", {"tool_use_id": "t3"})]
    out = prepass(rows, keep_recent_seq=4)
    assert out.rows[1].text.startswith("[tool result #2 shrunk by the pre-pass: \"line 0:")
    assert "\n" not in out.rows[1].text
    assert out.rows[1].content == {"tool_use_id": "t1", "is_error": False}
    assert out.rows[2].text == "tiny"  # too small to be worth shrinking
    assert out.rows[3] == rows[3]
    assert out.shrunk == 1
    assert out.tokens_saved == rows[1].token_count - out.rows[1].token_count > 0
    assert [r.seq for r in out.rows] == [1, 2, 3, 4]  # every tool_use keeps its result


def test_identical_results_point_to_the_latest_copy():
    rows = [row(1, MessageType.TOOL_RESULT, BIG), row(2, MessageType.TOOL_RESULT, BIG),
            row(3, MessageType.TOOL_RESULT, BIG)]
    out = prepass(rows, keep_recent_seq=3)
    assert out.rows[0].text == "[same tool result as #3]"
    assert out.rows[1].text == "[same tool result as #3]"
    assert out.rows[2].text == BIG and out.deduped == 2


def test_stale_images_are_dropped_and_counted():
    img = {"type": "image", "source": {"type": "base64", "data": "AAAA"}}
    rows = [row(1, MessageType.USER, "look", [{"type": "text", "text": "look"}, img]),
            row(2, MessageType.TOOL_RESULT, "shot", {"tool_use_id": "t", "content": [img]}),
            row(3, MessageType.USER, "again", [img])]
    out = prepass(rows, keep_recent_seq=3)
    assert out.images_dropped == 2
    assert out.rows[0].content[1] == {"type": "text", "text": "[image dropped by the pre-pass]"}
    assert out.rows[1].content["content"][0]["type"] == "text"
    assert out.rows[2].content == [img]
    assert out.tokens_saved == 2 * IMAGE_TOKENS


def test_anti_thrash_skips_only_after_recent_small_savings():
    window = 200_000
    assert not thrashing([], window)
    assert not thrashing([1_000], window)
    assert thrashing([50_000, 2_000, 3_000], window)
    assert not thrashing([2_000, 30_000], window)
    assert not thrashing([1, 1], 0)
