"""A message's attached files, pure: what is refused and how it is said, the estimate, and
how a request, the pre-pass and the memo carry them (schemas.attachments)."""

from __future__ import annotations

import base64
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activities.offline.accounting import Accounting
from schemas.attachments import (
    MAX_MESSAGE_ATTACHMENTS,
    MAX_REQUEST_ATTACHMENTS,
    NOT_RESENT,
    Attachment,
    attachment_problem,
    attachments_of,
    describe,
    files_problem,
    files_tokens,
    refused_file,
    sent_attachments,
    stored,
    stored_files_problem,
    upload_path,
)
from schemas.checkpoint.memo import memo_candidates
from schemas.checkpoint.prepass import prepass
from schemas.context import assemble_messages, estimate_tokens
from schemas.messages import MessageType, RecordRow
from schemas.tokens import count_tokens
from tests.attached import image, pdf


def described(path: str, data: bytes) -> Attachment:
    found = describe(path, data)
    assert isinstance(found, Attachment), found
    return found


def user_row(seq: int, text: str, files: list[tuple[str, bytes]]) -> RecordRow:
    items = [stored(described(path, data), data) for path, data in files]
    return RecordRow(seq=seq, type=MessageType.USER, text=text,
                     content={"attachments": items} if items else None,
                     token_count=count_tokens(text) + sum(i["tokens"] for i in items))


def test_each_kind_is_read_from_its_bytes_never_its_name():
    shot = described("shots/screen.txt", image(1280, 720, "JPEG"))  # named wrong
    assert (shot.name, shot.media_type, shot.width, shot.height) == (
        "screen.txt", "image/jpeg", 1280, 720)
    report = described("q3.png", pdf(3))
    assert (report.media_type, report.pages) == ("application/pdf", 3)
    notes = described("notes.bin", "déjà vu, twice\n".encode())
    assert notes.media_type == "text/plain"
    assert notes.tokens >= count_tokens("déjà vu, twice\n")


def test_what_the_model_would_refuse_is_refused_naming_the_file_and_the_limit():
    assert describe("a/empty.png", b"") == "empty.png is empty; nothing to attach"
    said = describe("tool.exe", b"MZ\x90\x00\x03\x00\x00\x00\x04\x00")
    assert isinstance(said, str) and said.startswith("tool.exe: Keel can attach images")
    wide = describe("wide.png", image(8_001, 2))
    assert wide == ("wide.png is 8001×2 pixels; the model takes at most 8000 a side: "
                    "scale it down")
    broken = describe("cut.png", image(100, 100)[:20])
    assert isinstance(broken, str) and "header cannot be read" in broken
    assert isinstance(describe("ok.png", image(8_000, 2)), Attachment)


def test_an_image_is_estimated_at_least_as_the_api_counts_it():
    # The vision guide's rule: w*h/750 once within 1,568 px a side and 1.15 megapixels.
    small = described("s.png", image(1000, 500))
    assert small.tokens >= math.ceil(1000 * 500 / 750)
    big = described("b.png", image(3000, 2000))
    assert big.tokens >= 1_590  # the guide's most for one image
    assert big.tokens <= 4_784 + 40  # and no more than the newer models' most (and its line)


def test_a_message_names_at_most_twenty_files_once_each_inside_the_workspace():
    assert attachment_problem(["a.png", "b.png"]) is None
    assert attachment_problem(["a.png", "./a.png"]) == "the same file is attached twice"
    many = [f"f{i}.png" for i in range(MAX_MESSAGE_ATTACHMENTS + 1)]
    assert attachment_problem(many) == "a message may carry at most 20 files; this one has 21"
    outside = attachment_problem(["../etc/passwd"])
    assert outside is not None and "outside the session's workspace" in outside


def test_a_client_puts_a_file_under_its_digest_keeping_its_name():
    data = image(10, 10)
    path = upload_path("C:\\Users\\me\\shot.png", data)
    assert path.startswith("attachments/") and path.endswith("/shot.png")
    assert upload_path("other/shot.png", data) == path
    assert upload_path("shot.png", image(11, 10)) != path
    # A name that is no file's (the folder itself, its parent) is put as "file" in it:
    # "attachments/<digest>/.." would be the uploads folder itself once normalised.
    for name in ("..", ".", "", "dir/..", "C:\\"):
        assert upload_path(name, data) == path.rsplit("/", 1)[0] + "/file", name


@pytest.mark.parametrize(("name", "kept"), [
    ("n" * 300 + ".txt", "n" * 193 + "….txt"),  # 200 bytes, the extension kept
    ("报告" * 80 + ".pdf", "报告" * 32 + "….pdf"),  # 3 bytes a character, cut whole
    ("x" * 250 + ".a-very-long-suffix-here", "x" * 197 + "…"),
    ("line\nbreak\x1b.png", "line_break_.png"),
])
def test_a_file_s_name_is_a_label_never_a_reason_to_refuse_it(name, kept):
    # A name past one path part's 200 bytes (67 Chinese characters) or with a control
    # character was refused with the whole message ("each name in it 200").
    path = upload_path(name, b"report")
    assert path.rsplit("/", 1)[1] == kept
    assert attachment_problem([path]) is None


def test_files_ride_before_their_words_and_each_is_named():
    data = image(640, 480)
    rows = [user_row(1, "what is wrong here?", [("shots/err.png", data)])]
    messages, _ = assemble_messages(rows)
    blocks = messages[0]["content"]
    assert [b["type"] for b in blocks] == ["image", "text"]
    assert blocks[0]["source"] == {"type": "base64", "media_type": "image/png",
                                   "data": base64.b64encode(data).decode()}
    assert blocks[1]["text"] == ("what is wrong here?\n"
                                 "[attached: err.png (image/png, 640×480, "
                                 f"{len(data) / 1024:.1f} KB)]")
    text_doc = [user_row(1, "", [("notes.md", b"# Notes\nship it")])]
    doc = assemble_messages(text_doc)[0][0]["content"][0]
    assert doc == {"type": "document", "title": "notes.md",
                   "source": {"type": "text", "media_type": "text/plain",
                              "data": "# Notes\nship it"}}


def test_a_request_carries_the_newest_files_only_and_names_the_rest():
    rows = [user_row(seq, f"shot {seq}", [(f"s{seq}.png", image(20 + seq, 20))])
            for seq in range(1, MAX_REQUEST_ATTACHMENTS + 4)]
    messages, _ = assemble_messages(rows)
    blocks = [b for m in messages for b in m["content"]]
    assert sum(b["type"] == "image" for b in blocks) == MAX_REQUEST_ATTACHMENTS
    texts = [b["text"] for b in blocks if b["type"] == "text"]
    assert all(t.endswith(NOT_RESENT) for t in texts[:3])
    assert not any(t.endswith(NOT_RESENT) for t in texts[3:])
    chosen = sent_attachments([(r.seq, r.content) for r in rows])
    assert min(seq for seq, _ in chosen) == 4


def test_the_prepass_lets_old_files_go_and_keeps_their_lines():
    rows = [user_row(1, "see this", [("a.png", image(900, 900))]),
            user_row(2, "and this", [("b.png", image(900, 900))])]
    out = prepass(rows, keep_recent_seq=2)
    assert "data" not in out.rows[0].content["attachments"][0]
    assert out.rows[1] == rows[1]
    assert 0 < out.tokens_saved < files_tokens(rows[0].content)
    assert out.rows[0].token_count == rows[0].token_count - out.tokens_saved
    first = assemble_messages(out.rows)[0][0]["content"]
    assert [b["type"] for b in first] == ["text", "image", "text"]
    assert first[0]["text"].endswith(NOT_RESENT)


def test_the_memo_keeps_the_words_and_the_line_of_each_file():
    rows = [user_row(1, "review the attached contract", [("deal.pdf", pdf(2))])]
    (candidate,) = memo_candidates([], rows)
    assert candidate.text == ("review the attached contract\n"
                              f"[attached: deal.pdf (application/pdf, 2 pages, "
                              f"{len(pdf(2)) / 1024:.1f} KB)]")
    assert candidate.tokens == count_tokens(candidate.text)


def test_an_imported_row_whose_bytes_are_not_its_description_is_refused():
    row = user_row(1, "x", [("a.png", image(50, 50))])
    assert stored_files_problem(row.content) is None
    item = row.content["attachments"][0]
    swapped = {"attachments": [{**item, "data": base64.b64encode(image(60, 50)).decode()}]}
    assert stored_files_problem(swapped) == (
        "a message's attached file 'a.png' is not the file its bytes make")
    exe = {"attachments": [{**item, "data": base64.b64encode(b"MZ\x00\x01").decode()}]}
    problem = stored_files_problem(exe)
    assert problem is not None and "Keel can attach images" in problem
    bad = {"attachments": [{**item, "data": "%%% not base64"}]}
    problem = stored_files_problem(bad)
    assert problem is not None and problem.startswith("a message's attached file is malformed")


def test_a_refusal_naming_an_attached_file_finds_it_and_the_apis_words():
    rows = [user_row(3, "a", [("a.png", image(30, 30))]),
            user_row(5, "b", [("b.png", image(40, 30)), ("c.txt", b"text")])]
    messages, _ = assemble_messages(rows)
    request = {"messages": messages}
    contents = [(r.seq, r.content) for r in rows]
    said = ("model API answered 400: Error code: 400 - {'type': 'error', 'error': {'type': "
            "'invalid_request_error', 'message': 'messages.0.content.2.image.source.base64: "
            "The image was specified using the image/png media type, but the image appears "
            "to be a image/jpeg image'}, 'request_id': 'req_1'}")
    assert refused_file(said, request, contents) == (
        5, 0, "The image was specified using the image/png media type, but the image "
              "appears to be a image/jpeg image")
    document = "messages.0.content.3.document.source.text.data: bad (request_id: r, path: x)"
    assert refused_file(document, request, contents) == (5, 1, "bad")
    tool_image = ("messages.8.content.0.tool_result.content.1.image.source.base64: The image "
                  "was specified using the image/png media type")
    assert refused_file(tool_image, request, contents) is None
    assert refused_file("prompt is too long: 300000 tokens > 200000 maximum", request,
                        contents) is None
    assert refused_file("messages.0.content.9.image.source: x", request, contents) is None


def test_the_estimate_counts_the_files_a_request_sends_not_every_one_in_the_window():
    """Thirty screenshots in a window, the newest twenty sent: the estimate stays at or
    above the API's count of the request and near it (before, it counted all thirty)."""
    rows = [user_row(seq, f"step {seq}: the page after the click",
                     [(f"s{seq}.png", image(600 + seq, 400))]) for seq in range(1, 31)]
    messages, _ = assemble_messages(rows)
    counted = Accounting().request({"messages": messages})
    estimated = estimate_tokens("", rows, [])
    assert counted <= estimated <= counted * 1.1, (counted, estimated)
    refused = [r.model_copy(update={"content": {"attachments": [
        {**r.content["attachments"][0], "refused": "Could not process image"}]}})
        if r.seq == 30 else r for r in rows]
    messages, _ = assemble_messages(refused)
    assert Accounting().request({"messages": messages}) <= estimate_tokens("", refused, []) \
        <= Accounting().request({"messages": messages}) * 1.1


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.binary(max_size=400),
    st.sampled_from([b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF89a", b"RIFF\x00\x00\x00\x00WEBP",
                     b"%PDF-1.7\n", b"RIFF\x00\x00\x00\x00WEBPVP8X"]).flatmap(
        lambda head: st.binary(max_size=200).map(lambda tail: head + tail))))
def test_any_bytes_are_described_or_refused_in_words_never_an_exception(data):
    found = describe("f.bin", data)
    assert isinstance(found, (Attachment, str))
    if isinstance(found, Attachment):
        assert found.size == len(data) and found.tokens > 0
        assert stored_files_problem({"attachments": [stored(found, data)]}) is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.recursive(
    st.none() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3), max_leaves=12))
def test_any_refusal_or_content_is_read_without_an_exception(refusal, content):
    assert refused_file(refusal, {"messages": []}, [(1, content)]) is None
    assert isinstance(stored_files_problem(content), (str, type(None)))
    assert attachments_of(content) == [] or isinstance(content, dict)


def test_a_message_carries_no_more_than_a_request_takes():
    """A file, or a message's files together, past 24 MB as sent could never ride in a
    request (and a row that large is past what the record takes): refused in words."""
    big = describe("dump.txt", b"a" * 19_000_000)
    assert big == ("dump.txt is 24.2 MB as sent; a request carries at most 24.0 MB of files: "
                   "split it or send a smaller one")
    part = described("part.txt", b"a" * 7_000_000)
    assert files_problem([part, part]) is None
    assert files_problem([part, part, part, part]) == (
        "the message's files are 35.6 MB as sent; a request carries at most 24.0 MB of "
        "files: send fewer or smaller ones")
