"""Image and document blocks at the fake Messages API, through the real `anthropic` SDK: the
API's refusals of files (type, size, pixels, pages) with its wording and paths, and its count
of each file; and Keel's own header parsers (`schemas.attachments`) against Pillow's and
pypdf's reading of real files."""

from __future__ import annotations

import base64
import io
import math
import zlib
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from pypdf import PdfReader

from activities.offline.accounting import (
    IMAGE_TOKENS,
    PDF_PAGE_TOKENS_COUNTED,
    Accounting,
    vision_tokens,
)
from schemas.attachments import describe, image_size, image_tokens, pdf_pages, sniff
from schemas.tokens import count_tokens
from tests.attached import image, pdf
from tests.fake_anthropic import FakeAnthropic, text_message
from tests.fake_anthropic.media import image_verdict

MODEL = "claude-sonnet-5"
MEDIA_TYPE = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif",
              "WEBP": "image/webp"}
READ_FILE = {"name": "read_file", "description": "Read a file.",
             "input_schema": {"type": "object", "properties": {}}}


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    server = FakeAnthropic(lambda body: text_message("ok")).start()
    yield server
    server.stop()


@pytest.fixture
def client(fake) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fake.base_url, api_key="test", max_retries=0)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def image_block(data: bytes | str, media_type: str = "image/png") -> dict[str, Any]:
    encoded = data if isinstance(data, str) else b64(data)
    return {"type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": encoded}}


def pdf_block(data: bytes, title: str = "report.pdf") -> dict[str, Any]:
    return {"type": "document", "title": title,
            "source": {"type": "base64", "media_type": "application/pdf", "data": b64(data)}}


def text_block(text: Any, title: str = "notes.txt") -> dict[str, Any]:
    return {"type": "document", "title": title,
            "source": {"type": "text", "media_type": "text/plain", "data": text}}


def said(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    """One user message: the blocks, then a question."""
    return [{"role": "user", "content": [*blocks, {"type": "text", "text": "What is this?"}]}]


def in_tool_result(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    """The blocks as a read_file tool's result, in the third message."""
    return [{"role": "user", "content": "Read the file."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                               "name": "read_file", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": [{"type": "text", "text": "the file:"},
                                                      *blocks]}]}]


def request(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A request's arguments: the messages, and the tool their tool blocks need."""
    kw: dict[str, Any] = {"model": MODEL, "messages": messages}
    if len(messages) > 1:
        kw["tools"] = [READ_FILE]
    return kw


def refusal(client: anthropic.Anthropic, messages: list[dict[str, Any]]) -> str:
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(max_tokens=64, **request(messages))
    body: Any = err.value.body
    assert body["error"]["type"] == "invalid_request_error"
    return str(body["error"]["message"])


def counted(client: anthropic.Anthropic, messages: list[dict[str, Any]]) -> int:
    """The prompt as the fake counts it, by the count_tokens endpoint and by a reply's usage
    (the two agree)."""
    by_endpoint = client.messages.count_tokens(**request(messages)).input_tokens
    reply = client.messages.create(max_tokens=64, **request(messages))
    assert reply.usage.input_tokens == by_endpoint
    return by_endpoint


def added(client: anthropic.Anthropic, messages: list[dict[str, Any]]) -> int:
    """What the files of `messages` (made by `said` or `in_tool_result`) add to the count:
    the count less that of the same messages without them."""
    bare = said() if len(messages) == 1 else in_tool_result()
    return counted(client, messages) - counted(client, bare)


# Refusals


WHERE = "messages.0.content.0.image.source.base64"
IN_RESULT = "messages.2.content.0.tool_result.content.1.image.source.base64"


def test_an_image_media_type_outside_the_four_is_refused(client):
    assert refusal(client, said(image_block(image(4, 4, "BMP"), "image/bmp"))) == (
        f"{WHERE}.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or"
        " 'image/webp'")


def test_an_image_over_5_mb_as_base64_is_refused_by_its_base64_length(client):
    data = "A" * (5 * 1024 * 1024 + 4)  # never decoded: the length is checked first
    assert refusal(client, said(image_block(data))) == (
        f"{WHERE}: image exceeds 5 MB maximum: 5242884 bytes > 5242880 bytes")


def test_bytes_of_another_type_than_declared_are_refused_wherever_the_image_sits(client):
    jpeg = image(30, 20, "JPEG")
    assert refusal(client, said(image_block(jpeg, "image/png"))) == (
        f"{WHERE}: The image was specified using the image/png media type, but the image"
        " appears to be a image/jpeg image")
    assert refusal(client, in_tool_result(image_block(image(30, 20, "GIF"),
                                                      "image/webp"))) == (
        f"{IN_RESULT}: The image was specified using the image/webp media type, but the image"
        " appears to be a image/gif image")


@pytest.mark.parametrize("data", [
    b64(b"this is no image at all"),
    "not base64 at all!",
    b64(image(300, 200)[:120]),  # a PNG cut short: its header whole, its pixels not
    "",
], ids=["text", "bad-base64", "cut-png", "empty"])
def test_bytes_no_reader_can_use_are_refused(client, data):
    assert refusal(client, said(image_block(data))) == f"{WHERE}.data: Could not process image"


def test_an_image_past_8000_pixels_a_side_is_refused(client):
    assert counted(client, said(image_block(image(8000, 1)))) > 0
    assert refusal(client, said(image_block(image(8001, 1)))) == (
        f"{WHERE}.data: At least one of the image dimensions exceed max allowed size:"
        " 8000 pixels")
    assert refusal(client, in_tool_result(image_block(image(1, 8001)))) == (
        f"{IN_RESULT}.data: At least one of the image dimensions exceed max allowed size:"
        " 8000 pixels")


def test_past_20_images_a_request_takes_2000_pixels_a_side(client):
    small = image_block(image(2, 2))
    big = image_block(image(2001, 3))
    assert counted(client, said(*[small] * 19, big)) > 0  # 20 images: 8,000 still
    assert refusal(client, said(*[small] * 20, big)) == (
        "messages.0.content.20.image.source.base64.data: At least one of the image"
        " dimensions exceed max allowed size for many-image requests: 2000 pixels")
    assert counted(client, said(*[small] * 20, image_block(image(2000, 3)))) > 0


def test_more_than_100_images_are_refused(client):
    small = image_block(image(2, 2))
    assert counted(client, said(*[small] * 100)) > 0
    assert refusal(client, said(*[small] * 101)) == "Too many images: 101 > 100 maximum"
    assert refusal(client, in_tool_result(*[small] * 101)) == (
        "Too many images: 101 > 100 maximum")


def test_a_pdf_no_reader_can_read_is_refused(client):
    for data in (b"%PDF-1.4\nnot really", pdf(2)[:200]):
        assert refusal(client, said(pdf_block(data))) == (
            "messages.0.content.0.pdf.source.base64.data: The PDF specified was not valid.")
    assert refusal(client, in_tool_result(pdf_block(b"plain words"))) == (
        "messages.2.content.0.tool_result.content.1.pdf.source.base64.data: The PDF"
        " specified was not valid.")


def test_more_than_100_pdf_pages_in_a_request_are_refused(client, fake):
    fake.context_window = 300_000  # 100 pages are 200,000 tokens: past a 200k window
    assert counted(client, said(pdf_block(pdf(60)), pdf_block(pdf(40), "b.pdf"))) > 0
    assert refusal(client, said(pdf_block(pdf(60)), pdf_block(pdf(41), "b.pdf"))) == (
        "A maximum of 100 PDF pages may be provided.")


@pytest.mark.parametrize(("block", "message"), [
    (text_block(42), "messages.0.content.0.document.source.text.data: Input should be a"
                     " valid string"),
    ({**text_block("x"), "source": {"type": "text", "media_type": "text/markdown",
                                    "data": "# x"}},
     "messages.0.content.0.document.source.text.media_type: Input should be 'text/plain'"),
    ({**pdf_block(b"x"), "source": {"type": "base64", "media_type": "text/plain",
                                    "data": b64(b"x")}},
     "messages.0.content.0.pdf.source.base64.media_type: Input should be 'application/pdf'"),
    ({"type": "document", "source": {"type": "zip", "data": "x"}},
     "messages.0.content.0.document.source: Input tag 'zip' found using 'type' does not"
     " match any of the expected tags: 'base64', 'text', 'content', 'url', 'file'"),
    ({"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
     "messages.0.content.0.document.source: the fake Messages API does not model 'url'"
     " sources"),
    ({"type": "image", "source": {"type": "text", "data": "x"}},
     "messages.0.content.0.image.source: Input tag 'text' found using 'type' does not"
     " match any of the expected tags: 'base64', 'url', 'file'"),
    ({"type": "image"}, "messages.0.content.0.image.source: Field required"),
    ({"type": "image", "source": {"type": "base64", "media_type": "image/png"}},
     f"{WHERE}.data: Field required"),
], ids=["text-not-str", "text-type", "pdf-type", "unknown-source", "url-source",
        "image-text-source", "no-source", "no-data"])
def test_a_malformed_document_or_image_source_is_refused(client, block, message):
    assert refusal(client, said(block)) == message


def test_a_file_is_read_once_however_often_it_is_sent(client):
    block = image_block(image(123, 45))
    counted(client, said(block))
    before = image_verdict.cache_info()
    counted(client, said(block))
    after = image_verdict.cache_info()
    assert after.misses == before.misses and after.hits > before.hits


# Counting


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP"])
def test_an_image_counts_a_token_per_750_pixels(client, fmt):
    messages = said(image_block(image(1000, 500, fmt), MEDIA_TYPE[fmt]))
    assert added(client, messages) == math.ceil(
        1000 * 500 / 750) == 667


def test_a_large_image_counts_at_its_downscaled_size(client):
    # 3000×2000 → within 1,092² pixels: ×0.4458 → 1337×891 (rounded down) → 1,589 tokens.
    messages = said(image_block(image(3000, 2000)))
    assert added(client, messages) == math.ceil(
        1337 * 891 / 750) == 1589
    # A long strip is held to 1,568 pixels on its long edge: 5000×300 → 1568×94.
    strip = said(image_block(image(5000, 300)))
    assert added(client, strip) == math.ceil(1568 * 94 / 750)


def test_an_image_in_a_tool_result_counts_the_same(client):
    messages = in_tool_result(image_block(image(1000, 500)))
    assert added(client, messages) == 667


def test_a_pdf_counts_its_pages_and_its_title(client):
    messages = said(pdf_block(pdf(3), "q3 report.pdf"))
    assert added(client, messages) == (
        3 * PDF_PAGE_TOKENS_COUNTED + count_tokens("q3 report.pdf"))
    in_result = in_tool_result(pdf_block(pdf(2), "a.pdf"))
    assert added(client, in_result) == (
        2 * PDF_PAGE_TOKENS_COUNTED + count_tokens("a.pdf"))


def test_a_text_document_counts_its_text_and_its_title(client):
    text = "Meeting notes: ship the attachments work on Friday, then review the fake.\n" * 20
    messages = said(text_block(text, "notes.txt"))
    assert added(client, messages) == (
        count_tokens(text) + count_tokens("notes.txt"))


def test_a_file_whose_size_cannot_be_read_keeps_the_fixed_figure_and_skew_applies():
    unreadable = image_block(b64(b"no image"))
    assert Accounting().block(unreadable) == IMAGE_TOKENS
    assert Accounting().block({"type": "document", "source": {"type": "url", "url": "u"}}) == (
        IMAGE_TOKENS)
    shot = image_block(image(1000, 500))
    assert Accounting(skew=1.25).block(shot) == round(667 * 1.25)
    assert Accounting(skew=0.8).block(shot) == round(667 * 0.8)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8000), st.integers(1, 8000))
def test_keels_estimate_of_an_image_is_never_below_the_count(width, height):
    assert image_tokens(width, height) >= vision_tokens(width, height)


def test_keels_estimate_of_each_file_is_never_below_the_count():
    for name, data, block in [
            ("a.png", image(1000, 500), image_block(image(1000, 500))),
            ("b.png", image(3000, 2000), image_block(image(3000, 2000))),
            ("c.pdf", pdf(3), pdf_block(pdf(3), "c.pdf")),
            ("d.txt", b"some notes\n" * 50, text_block("some notes\n" * 50, "d.txt"))]:
        found = describe(name, data)
        assert not isinstance(found, str), found
        assert found.tokens >= Accounting().block(block), name


# Keel's header parsers against Pillow and pypdf


FORMATS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "png": ("PNG", "RGB", {}),
    "png-alpha": ("PNG", "RGBA", {}),
    "jpeg": ("JPEG", "RGB", {}),
    "jpeg-progressive": ("JPEG", "RGB", {"progressive": True}),
    "jpeg-exif": ("JPEG", "RGB", {"exif": b"Exif\x00\x00" + b"MM\x00\x2a\x00\x00\x00\x08"
                                  + b"\x00\x00" + b"\x00" * 9000}),
    "gif": ("GIF", "RGB", {}),
    "webp-lossy": ("WEBP", "RGB", {"quality": 50}),
    "webp-lossless": ("WEBP", "RGB", {"lossless": True}),
    "webp-alpha": ("WEBP", "RGBA", {"quality": 50}),
    "webp-alpha-lossless": ("WEBP", "RGBA", {"lossless": True}),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(FORMATS)), st.integers(1, 3000), st.integers(1, 3000))
def test_image_size_agrees_with_pillow(kind, width, height):
    fmt, mode, save = FORMATS[kind]
    data = image(width, height, fmt, mode, **save)
    with Image.open(io.BytesIO(data)) as opened:
        assert opened.format == fmt
        assert opened.size == (width, height)
    assert sniff(data) == MEDIA_TYPE[fmt]
    assert image_size(data, MEDIA_TYPE[fmt]) == (width, height)


@pytest.mark.parametrize("kind", sorted(FORMATS))
@pytest.mark.parametrize("size", [(1, 1), (3000, 1), (1, 3000), (8000, 3)])
def test_image_size_agrees_with_pillow_at_the_edges(kind, size):
    fmt, mode, save = FORMATS[kind]
    data = image(*size, fmt, mode, **save)
    with Image.open(io.BytesIO(data)) as opened:
        assert opened.size == size
    assert sniff(data) == MEDIA_TYPE[fmt]
    assert image_size(data, MEDIA_TYPE[fmt]) == size


def test_the_webp_variants_exercise_each_header():
    """Each WebP chunk kind `image_size` reads is one Pillow writes here."""
    chunks = {kind: image(10, 10, *FORMATS[kind][:2], **FORMATS[kind][2])[12:16]
              for kind in FORMATS if kind.startswith("webp")}
    assert chunks["webp-lossy"] == b"VP8 " and chunks["webp-lossless"] == b"VP8L"
    assert chunks["webp-alpha"] == b"VP8X"


@pytest.mark.parametrize("pages", [1, 2, 7, 30])
def test_pdf_pages_agrees_with_pypdf(pages):
    data = pdf(pages)
    assert sniff(data) == "application/pdf"
    assert pdf_pages(data) == len(PdfReader(io.BytesIO(data)).pages) == pages


def pdf_with_object_streams(pages: int) -> bytes:
    """A PDF 1.5 whose page objects sit in a compressed object stream, indexed by an xref
    stream: how most writers save a PDF now (pdfTeX, Word, Chrome's "save as PDF", qpdf).
    No "/Type /Page" appears in its bytes."""
    objects = {2: f"<< /Type /Pages /Count {pages} /Kids ["
                  + " ".join(f"{3 + i} 0 R" for i in range(pages)) + "] >>"}
    for i in range(pages):
        objects[3 + i] = "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >>"
    head, body = [], b""
    for number, text in objects.items():
        head.append(f"{number} {len(body)}")
        body += text.encode() + b"\n"
    index = (" ".join(head) + "\n").encode()
    packed = zlib.compress(index + body)
    stream_no, xref_no = 3 + pages, 4 + pages
    out = bytearray(b"%PDF-1.5\n%\xe2\xe3\xcf\xd3\n")
    offsets = {1: len(out)}
    out += b"1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n"
    offsets[stream_no] = len(out)
    out += (f"{stream_no} 0 obj\n<< /Type /ObjStm /N {len(objects)} /First {len(index)}"
            f" /Filter /FlateDecode /Length {len(packed)} >>\nstream\n").encode()
    out += packed + b"\nendstream\nendobj\n"
    offsets[xref_no] = len(out)
    rows = b"\x00\x00\x00\x00\x00\xff\xff"
    for number in range(1, xref_no + 1):
        if number in offsets:
            rows += b"\x01" + offsets[number].to_bytes(4, "big") + b"\x00\x00"
        else:  # in the object stream, at its place there
            rows += b"\x02" + stream_no.to_bytes(4, "big") + (number - 2).to_bytes(2, "big")
    out += (f"{xref_no} 0 obj\n<< /Type /XRef /Size {xref_no + 1} /W [1 4 2] /Root 1 0 R"
            f" /Length {len(rows)} >>\nstream\n").encode()
    out += rows + f"\nendstream\nendobj\nstartxref\n{offsets[xref_no]}\n%%EOF\n".encode()
    return bytes(out)


def test_a_pdf_with_object_streams_is_read_by_pypdf_and_the_fake(client):
    data = pdf_with_object_streams(3)
    assert len(PdfReader(io.BytesIO(data)).pages) == 3
    assert b"/Type /Page " not in data and b"/Type /Page\n" not in data
    assert counted(client, said(pdf_block(data))) > 0  # a valid PDF: not refused


def test_pdf_pages_counts_the_pages_of_a_pdf_with_object_streams():
    assert pdf_pages(pdf_with_object_streams(3)) == 3
