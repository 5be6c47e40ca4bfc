"""A user's message may carry files: images (PNG, JPEG, GIF, WebP), PDFs and UTF-8 text,
sent to the model as the Messages API's image and document blocks. No I/O.

Invariants:
- A file's kind is read from its bytes (`sniff`), never from its name or a declared type:
  the API refuses an image whose bytes are not the type the request says, and a record that
  held one would make every later request of the session fail the same way.
- What the API would refuse is refused before the message is recorded, in words that name
  the file and the limit (`describe`): an image past 8,000 pixels a side or 5 MB as
  base64, a PDF past 100 pages or one pypdf cannot read (damaged, encrypted), a file of no
  kind the API takes, more than `MAX_MESSAGE_ATTACHMENTS` files. Nothing of the message is
  kept then. What the API refuses all the same (a body past a header Keel read) is named by
  its refusal (`refused_file`), marked in the record, and never sent again.
- An attachment is estimated at least as the API counts it (`Attachment.tokens`): an image
  by its pixels after the API's own downscale, by the larger of its two published rules;
  a PDF page at `PDF_PAGE_TOKENS`; text by its tokens. The row's token count includes it.
- The record keeps each file's bytes in its message's row (`stored`), so a fork, an export
  and the context rebuilt every turn read them from the record like its words, whatever
  the workspace holds later.
- A request carries the bytes of at most `MAX_REQUEST_ATTACHMENTS` attachments within
  `REQUEST_ATTACHMENT_BYTES` and 100 PDF pages, the newest first (`sent_attachments`); an
  older one is the line naming it. Each attachment is named to the model, in the memo and
  in transcripts by one line (`attachment_line`).
"""

from __future__ import annotations

import base64
import hashlib
import io
import math
import posixpath
import re
from typing import Any

from pydantic import BaseModel

from schemas.files import MAX_PATH_PART_BYTES, normal_path, workspace_path_problem
from schemas.text import has_controls

__all__ = [
    "CONTENT_WITHOUT_BYTES_SQL",
    "IMAGE_MAX_BASE64_BYTES",
    "IMAGE_MAX_PIXELS",
    "IMAGE_TYPES",
    "MAX_MESSAGE_ATTACHMENTS",
    "MAX_REQUEST_ATTACHMENTS",
    "NOT_RESENT",
    "PDF_MAX_PAGES",
    "PDF_PAGE_TOKENS",
    "REFUSED_NOTE",
    "REQUEST_ATTACHMENT_BYTES",
    "UPLOADS_DIR",
    "Attachment",
    "api_block",
    "attachment_line",
    "attachment_problem",
    "attachments_of",
    "describe",
    "file_blocks",
    "files_problem",
    "files_tokens",
    "image_size",
    "image_tokens",
    "pdf_pages",
    "refused_file",
    "sending_problem",
    "sent_attachments",
    "sniff",
    "stored",
    "stored_files_problem",
    "unsent_tokens",
    "upload_path",
    "with_lines",
    "without_data",
]

MAX_MESSAGE_ATTACHMENTS = 20
# The API takes up to 100 images a request, and 20 before it lowers the size it accepts to
# 2,000 pixels a side; a request also has a size limit (32 MB). Older files are named only.
MAX_REQUEST_ATTACHMENTS = 20
REQUEST_ATTACHMENT_BYTES = 24 * 1024 * 1024  # base64, all a request's files together
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
IMAGE_MAX_PIXELS = 8_000  # a side
IMAGE_MAX_BASE64_BYTES = 5 * 1024 * 1024
PDF_MAX_PAGES = 100
# A PDF page is sent as its text and an image of it: 1,500 to 3,000 tokens by the API's
# guide; the estimate takes the top.
PDF_PAGE_TOKENS = 3_000
# Said after the line of a file whose bytes a request does not carry.
NOT_RESENT = " (not sent again: only the newest files ride in a request)"
# Said after the line of a file the API refused (its words): the record keeps it, never sent.
REFUSED_NOTE = " (not sent: the model refused it: {reason})"
PDF = "application/pdf"
TEXT = "text/plain"
_KINDS = "images (PNG, JPEG, GIF, WebP), PDFs and UTF-8 text"


class Attachment(BaseModel):
    """One file of a message, as the record names it (its bytes ride beside, `stored`)."""

    name: str  # the file's name, the last part of its workspace path
    path: str  # where it was in the session's workspace when sent
    media_type: str
    size: int  # bytes
    sha256: str
    width: int | None = None
    height: int | None = None
    pages: int | None = None
    tokens: int = 0  # the estimate of what the API counts for it


def sniff(data: bytes) -> str | None:
    """The media type `data` is, by its first bytes; None when it is none the API takes."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"%PDF-"):
        return PDF
    if b"\x00" in data:
        return None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return TEXT


def _be16(data: bytes, at: int) -> int:
    return int.from_bytes(data[at:at + 2], "big")


def _le(data: bytes, at: int, n: int) -> int:
    return int.from_bytes(data[at:at + n], "little")


# JPEG markers that start a frame and carry its size (SOF0-3, 5-7, 9-11, 13-15).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _SOF:
            return _be16(data, i + 7), _be16(data, i + 5)
        if marker == 0x01 or 0xD0 <= marker <= 0xD9:  # markers without a length
            i += 2
            continue
        i += 2 + _be16(data, i + 2)
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:
        return _le(data, 26, 2) & 0x3FFF, _le(data, 28, 2) & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        b = data[21:25]
        return 1 + (b[0] | (b[1] & 0x3F) << 8), 1 + (b[1] >> 6 | b[2] << 2 | (b[3] & 0x0F) << 10)
    if chunk == b"VP8X" and len(data) >= 30:
        return 1 + _le(data, 24, 3), 1 + _le(data, 27, 3)
    return None


def image_size(data: bytes, media_type: str) -> tuple[int, int] | None:
    """An image's width and height in pixels, read from its header; None when unreadable."""
    if media_type == "image/png" and len(data) >= 24 and data[12:16] == b"IHDR":
        size = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    elif media_type == "image/gif" and len(data) >= 10:
        size = _le(data, 6, 2), _le(data, 8, 2)
    elif media_type == "image/jpeg":
        found = _jpeg_size(data)
        if found is None:
            return None
        size = found
    elif media_type == "image/webp":
        found = _webp_size(data)
        if found is None:
            return None
        size = found
    else:
        return None
    return size if size[0] > 0 and size[1] > 0 else None


def image_tokens(width: int, height: int) -> int:
    """At least what the API counts for an image of this size. It downscales a large one
    first: by its vision guide, to 1,568 pixels a side and about 1.15 megapixels, then
    width × height / 750; newer models keep up to 2,576 pixels a side and 3.6 megapixels at
    one token a 28-pixel square. The larger of the two."""
    def scaled(edge: int, pixels: int) -> tuple[float, float]:
        s = min(1.0, edge / max(width, height), math.sqrt(pixels / (width * height)))
        return width * s, height * s

    w1, h1 = scaled(1_568, 1_192_464)
    w2, h2 = scaled(2_576, 3_605_000)
    return max(math.ceil(w1 * h1 / 750), math.ceil(w2 / 28) * math.ceil(h2 / 28))


def pdf_pages(data: bytes) -> int | None:
    """A PDF's page count, read by pypdf (its page tree, compressed object streams and all);
    None when it cannot be read: damaged, or encrypted (the API reads neither)."""
    from pypdf import PdfReader  # loads only when a PDF is described

    try:
        reader = PdfReader(io.BytesIO(data))
        return None if reader.is_encrypted else len(reader.pages)
    except Exception:  # pypdf raises many kinds on a damaged file; each means unreadable
        return None


def _kb(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def describe(path: str, data: bytes) -> Attachment | str:
    """The attachment `data` makes (from the workspace file at `path`), or why the API would
    not take it, as one sentence naming the file."""
    # The tokenizer loads here, not with the module: `keel.client` imports this (its
    # refusals before sending) and stays free of it until a file is described.
    from schemas.tokens import count_tokens

    name = posixpath.basename(path) or path
    if not data:
        return f"{name} is empty; nothing to attach"
    media_type = sniff(data)
    if media_type is None:
        return f"{name}: Keel can attach {_KINDS}, and this file is none of them"
    if _as_sent(len(data)) > REQUEST_ATTACHMENT_BYTES:
        return (f"{name} is {_kb(_as_sent(len(data)))} as sent; a request carries at most "
                f"{_kb(REQUEST_ATTACHMENT_BYTES)} of files: split it or send a smaller one")
    found = Attachment(name=name, path=path, media_type=media_type, size=len(data),
                       sha256=hashlib.sha256(data).hexdigest())
    if media_type in IMAGE_TYPES:
        size = image_size(data, media_type)
        if size is None:
            return f"{name}: its {media_type} header cannot be read; is the file whole?"
        if max(size) > IMAGE_MAX_PIXELS:
            return (f"{name} is {size[0]}×{size[1]} pixels; the model takes at most "
                    f"{IMAGE_MAX_PIXELS} a side: scale it down")
        encoded = 4 * math.ceil(len(data) / 3)
        if encoded > IMAGE_MAX_BASE64_BYTES:
            return (f"{name} is {encoded} bytes as sent; the model takes an image of at most "
                    f"{IMAGE_MAX_BASE64_BYTES} bytes (5 MB): scale or compress it")
        found.width, found.height = size
        found.tokens = image_tokens(*size)
    elif media_type == PDF:
        found.pages = pdf_pages(data)
        if found.pages is None:
            return (f"{name}: this PDF cannot be read (damaged, or encrypted); the model "
                    "reads neither")
        if found.pages > PDF_MAX_PAGES:
            return (f"{name} has {found.pages} pages; the model takes a PDF of at most "
                    f"{PDF_MAX_PAGES}: split it")
        found.tokens = found.pages * PDF_PAGE_TOKENS
    else:
        found.tokens = count_tokens(data.decode("utf-8"))
    found.tokens += count_tokens(attachment_line(found))
    return found


def attachment_problem(paths: list[str]) -> str | None:
    """Why a message may not name files at `paths`, before anything is read: too many, one
    twice, a path no workspace holds (`schemas.files.workspace_path_problem`); or None."""
    if len(paths) > MAX_MESSAGE_ATTACHMENTS:
        return (f"a message may carry at most {MAX_MESSAGE_ATTACHMENTS} files; "
                f"this one has {len(paths)}")
    if len({normal_path(p) for p in paths}) != len(paths):
        return "the same file is attached twice"
    for path in paths:
        problem = workspace_path_problem(path)
        if problem:
            return problem
    return None


UPLOADS_DIR = "attachments"


def upload_path(name: str, data: bytes) -> str:
    """Where a file a client sends with a message is put in the session's workspace first:
    under its digest, so two files of one name never meet and a file sent again is the
    same path. Its name is a label, not a reason to refuse the file: a control character
    becomes "_", and a name past what one path part holds (200 bytes: 67 characters of
    Chinese) is cut short, its extension kept."""
    base = posixpath.basename(name.replace("\\", "/"))
    base = "".join("_" if has_controls(c) else c for c in base)
    base = "file" if base in ("", ".", "..") else _fitted(base)  # a name that is no file's
    return f"{UPLOADS_DIR}/{hashlib.sha256(data).hexdigest()[:12]}/{base}"


def _fitted(name: str) -> str:
    """`name` within one path part's bytes: its stem cut at a character, "…" marking the
    cut, before an extension of up to 16 bytes (a longer one is part of what is cut)."""
    if len(name.encode()) <= MAX_PATH_PART_BYTES:
        return name
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem or len(ext.encode()) > 16:
        stem, dot, ext = name, "", ""
    room = MAX_PATH_PART_BYTES - len(f"…{dot}{ext}".encode())
    return stem.encode()[:room].decode("utf-8", "ignore") + f"…{dot}{ext}"


def _as_sent(size: int) -> int:
    """A file of `size` bytes as base64."""
    return 4 * math.ceil(size / 3)


def files_problem(found: list[Attachment]) -> str | None:
    """Why one message's files, each taken, are too much together: more bytes as sent than a
    request carries (none of them could then ride with the others, and a row that large is
    past what the record takes); or None."""
    sent = sum(_as_sent(f.size) for f in found)
    if sent > REQUEST_ATTACHMENT_BYTES:
        return (f"the message's files are {_kb(sent)} as sent; a request carries at most "
                f"{_kb(REQUEST_ATTACHMENT_BYTES)} of files: send fewer or smaller ones")
    return None


def sending_problem(paths: list[str], given: list[tuple[str, bytes]]) -> str | None:
    """Why a message naming files at `paths` may not carry them, those of them a client
    holds the bytes of (`given`: path and bytes) described as the session will describe
    them; None when nothing known yet refuses them (the session reads the others)."""
    problem = attachment_problem(paths)
    found: list[Attachment] = []
    for path, data in given:
        if problem is not None:
            break
        made = describe(path, data)
        if isinstance(made, str):
            problem = made
        else:
            found.append(made)
    return problem or files_problem(found)


def attachment_line(found: Attachment) -> str:
    """The line naming an attachment: beside it for the model, and where its bytes are not
    (the memo, a transcript, an older request)."""
    if found.width and found.height:
        what = f"{found.media_type}, {found.width}×{found.height}"
    elif found.pages:
        what = f"{found.media_type}, {found.pages} page{'s' if found.pages != 1 else ''}"
    else:
        what = found.media_type
    return f"[attached: {found.name} ({what}, {_kb(found.size)})]"


# A row's `content` as a reader for people or a transcript takes it: a message's files
# described, their bytes left out (a page of the record is bounded in rows, and must be in
# bytes too). SQL over the `messages` table's `content` column.
CONTENT_WITHOUT_BYTES_SQL = (
    "CASE WHEN jsonb_typeof(content->'attachments') = 'array' THEN jsonb_set(content,"
    " '{attachments}', coalesce((SELECT jsonb_agg(a - 'data') FROM"
    " jsonb_array_elements(content->'attachments') a), '[]'::jsonb)) ELSE content END")


def with_lines(text: str, items: Any) -> str:
    """A message's words and below them the line of each of its files (`items`: stored
    attachments, with or without their bytes; None or [] for none): what the memo, a
    transcript and the record's tools keep of it."""
    lines = [attachment_line(without_data(item)) for item in items or []
             if isinstance(item, dict)]
    return "\n".join([text, *lines] if text else lines)


def stored(found: Attachment, data: bytes) -> dict[str, Any]:
    """What the record keeps of one attachment: its description and its bytes (base64)."""
    return {**found.model_dump(), "data": base64.b64encode(data).decode("ascii")}


def attachments_of(content: Any) -> list[dict[str, Any]]:
    """A user row's stored attachments (its `content`), [] for any other content."""
    if isinstance(content, dict) and isinstance(content.get("attachments"), list):
        return [a for a in content["attachments"] if isinstance(a, dict)]
    return []


def without_data(item: dict[str, Any]) -> Attachment:
    """A stored attachment's description alone."""
    return Attachment.model_validate({k: v for k, v in item.items() if k != "data"})


def api_block(item: dict[str, Any]) -> dict[str, Any]:
    """A stored attachment as the Messages API's block: an image, or a document (a PDF as
    base64, text as text), titled with its name."""
    media_type, data = item["media_type"], item["data"]
    if media_type in IMAGE_TYPES:
        return {"type": "image",
                "source": {"type": "base64", "media_type": media_type, "data": data}}
    if media_type == PDF:
        source = {"type": "base64", "media_type": PDF, "data": data}
    else:
        source = {"type": "text", "media_type": TEXT,
                  "data": base64.b64decode(data).decode("utf-8")}
    return {"type": "document", "source": source, "title": item["name"]}


def file_blocks(seq: int, items: list[dict[str, Any]], sent: set[tuple[int, int]],
                head: str) -> list[dict[str, Any]]:
    """The blocks of a row at `seq` with files `items`: the files whose bytes the request
    carries (`sent`) first (the API's advice: images before the words about them), then
    `head` with a line naming each file; one not carried is said to be, and why."""
    blocks, lines = [], []
    for i, item in enumerate(items):
        line = attachment_line(without_data(item))
        if (seq, i) in sent:
            blocks.append(api_block(item))
        elif item.get("refused"):
            line += REFUSED_NOTE.format(reason=item["refused"])
        else:
            line += NOT_RESENT
        lines.append(line)
    return [*blocks, {"type": "text", "text": "\n".join([head, *lines] if head else lines)}]


def sent_attachments(contents: list[tuple[int, Any]], *, loaded_only: bool = True
                     ) -> set[tuple[int, int]]:
    """Of rows' contents (seq, content) in one request, the attachments (seq, index) whose
    bytes it carries: the newest, at most MAX_REQUEST_ATTACHMENTS within
    REQUEST_ATTACHMENT_BYTES and PDF_MAX_PAGES pages in all (the API's limit is the
    request's); never one the API refused (`refused`) or a pre-pass let go (`dropped`).
    Chosen by their descriptions; `loaded_only`: of those, the ones whose bytes are here
    (activities.attachments.with_bytes fetches the others' first)."""
    chosen: set[tuple[int, int]] = set()
    room, pages = REQUEST_ATTACHMENT_BYTES, PDF_MAX_PAGES
    for seq, content in sorted(contents, key=lambda sc: sc[0], reverse=True):
        items = attachments_of(content)
        for i in range(len(items) - 1, -1, -1):
            item = items[i]
            size = _as_sent(int(item.get("size") or 0))
            its_pages = int(item.get("pages") or 0)
            if (item.get("refused") or item.get("dropped") or size > room
                    or its_pages > pages or len(chosen) >= MAX_REQUEST_ATTACHMENTS):
                continue
            chosen.add((seq, i))
            room, pages = room - size, pages - its_pages
    return {c for c in chosen if not loaded_only or _loaded(contents, c)}


def unsent_tokens(contents: list[tuple[int, Any]]) -> int:
    """What rows' counts hold for files no request of them sends (past the newest the
    request carries, or refused), less the line each is still named by: taken off an
    estimate, which otherwise counts every screenshot of a long window. (A file a pre-pass
    let go is taken off its row's count already.)"""
    from schemas.tokens import count_tokens  # as in `describe`: the client stays free of it

    chosen = sent_attachments(contents, loaded_only=False)
    total = 0
    for seq, content in contents:
        for i, item in enumerate(attachments_of(content)):
            if (seq, i) not in chosen and not item.get("dropped"):
                found = without_data(item)
                total += max(found.tokens - count_tokens(attachment_line(found) + NOT_RESENT),
                             0)
    return total


def _loaded(contents: list[tuple[int, Any]], at: tuple[int, int]) -> bool:
    content = next(c for seq, c in contents if seq == at[0])
    return bool(attachments_of(content)[at[1]].get("data"))


def files_tokens(content: Any) -> int:
    """What a row's attached files add to its count (0 for a row without)."""
    return sum(without_data(item).tokens for item in attachments_of(content))


def stored_files_problem(content: Any) -> str | None:
    """Why a row's stored files, come from outside (an imported bundle), are not what Keel
    would have stored: a description its bytes do not make, bytes the API would refuse.
    Such a row would fail every later request of its session; None when they are whole."""
    for item in attachments_of(content):
        try:
            data = base64.b64decode(str(item.get("data") or ""), validate=True)
            claimed = without_data(item)
        except (ValueError, TypeError) as err:
            return f"a message's attached file is malformed: {err}"
        made = describe(claimed.path, data)
        if isinstance(made, str):
            return f"a message's attached file: {made}"
        if made != claimed:
            return f"a message's attached file {claimed.name!r} is not the file its bytes make"
    return None


# A refusal's path to a block that is an attached file (a user's, or a tool's image inside
# its `tool_result`), and its reason.
_REFUSED_BLOCK = re.compile(r"messages\.(\d+)\.content\.(\d+)\.(?:tool_result\.content\."
                            r"(\d+)\.)?(?:image|pdf|document)\b[\w.]*: (.+)", re.S)
# Where the API's words end in what the backend said: the SDK's dict quoting, or the
# request's id and path the backend adds after them.
_REASON_END = re.compile(r"""['"](?:\}|,\s*['"])| \(request_id: """)
REASON_CHARS = 300


def refused_file(refusal: str, request: dict[str, Any], contents: list[tuple[int, Any]]
                 ) -> tuple[int, int, str] | None:
    """The attachment (seq, index) of `contents` (rows' seq and content) whose block in
    `request` the API's `refusal` names, and the API's reason; None when the refusal is
    about no attached file (another 400 fails the call as before)."""
    found = _REFUSED_BLOCK.search(refusal)
    if found is None:
        return None
    try:
        block = request["messages"][int(found[1])]["content"][int(found[2])]
        if found[3] is not None:  # an image a tool returned, inside its result
            block = block["content"][int(found[3])]
    except (IndexError, KeyError, TypeError):
        return None
    shown = {k: v for k, v in block.items() if k != "cache_control"}
    reason = _REASON_END.split(found[4], 1)[0].strip()[:REASON_CHARS]
    for seq, content in contents:
        for i, item in enumerate(attachments_of(content)):
            if item.get("data") and api_block(item) == shown:
                return seq, i, reason
    return None
