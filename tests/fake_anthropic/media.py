"""The request rules the real Messages API enforces on image and document blocks.

Invariants:
- Every image and document block is checked wherever the API reads one: in a message's
  content and in a `tool_result` block's content list. A refusal names the block by the
  API's path ("messages.2.content.0.image.source.base64",
  "messages.8.content.0.tool_result.content.1.image.source.base64").
- A block's fields are checked first (`check_media_fields`, run with the other field
  checks, as the API validates the body's shape before it reads any file), then the request's
  files (`check_media`): the number of images, each file's bytes, the pages of all PDFs.
- An image's bytes are read by Pillow and a PDF's by pypdf, readers independent of Keel's
  own header parsers (`schemas.attachments`), so the fake refuses what the API would
  whatever Keel believes of a file.
- A verdict on a file's bytes is kept per exact base64 string (a bounded LRU): a session
  resends the same files every turn, and decoding them again each time would be most of
  the fake's work.

Wordings are the API's as quoted in public bug reports, except where a comment says not.
Pydantic-shaped field errors ("Input should be ...", "Field required") follow the wording
of the API's other field errors; their exact paths for documents are a guess, said below.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from PIL import Image
from pypdf import PdfReader

from activities.offline.blocks import message_blocks

IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
IMAGE_MAX_BASE64 = 5 * 1024 * 1024  # the base64 string's length, not the decoded bytes
IMAGE_MAX_SIDE = 8_000
MANY_IMAGES = 20  # a request with more images than this takes smaller ones
MANY_IMAGES_MAX_SIDE = 2_000
MAX_IMAGES = 100
# Pages of all the request's PDFs together. The docs now allow 600 when the request's
# context window is 1M tokens; the fake's models all have smaller windows.
MAX_PDF_PAGES = 100
PDF = "application/pdf"
TEXT = "text/plain"
# Pillow's name of a format → the media type the API would say the bytes are. MPO is the
# multi-picture JPEG some cameras write: JPEG bytes, opened by Pillow under its own name.
_PILLOW_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "MPO": "image/jpeg",
                 "GIF": "image/gif", "WEBP": "image/webp"}
_VERDICT_CACHE = 64  # distinct files whose verdicts are kept (the keys hold the strings)


@dataclass(frozen=True)
class Media:
    """One image or document block, by the API's path to it."""

    where: str  # "messages.2.content.0", "messages.8.content.0.tool_result.content.1"
    kind: str  # "image" or "document"
    block: dict[str, Any]


def media_blocks(body: dict[str, Any]) -> list[Media]:
    """Every image and document block of the request's messages, in order."""
    found: list[Media] = []
    for i, message in enumerate(body["messages"]):
        if not isinstance(message, dict):
            continue
        for j, block in enumerate(message_blocks(message)):
            kind = block.get("type")
            where = f"messages.{i}.content.{j}"
            if kind in ("image", "document"):
                found.append(Media(where, str(kind), block))
            elif kind == "tool_result" and isinstance(block.get("content"), list):
                for k, item in enumerate(block["content"]):
                    if isinstance(item, dict) and item.get("type") in ("image", "document"):
                        found.append(Media(f"{where}.tool_result.content.{k}",
                                           str(item["type"]), item))
    return found


def _source_problem(media: Media) -> str | None:
    """The field error of one block's source, or None."""
    source = media.block.get("source")
    at = f"{media.where}.{media.kind}.source"
    if source is None:
        return f"{at}: Field required"
    if not isinstance(source, dict):
        return f"{at}: Input should be a valid dictionary or object to extract fields from"
    kind = source.get("type")
    known = ("base64", "url", "file") if media.kind == "image" else (
        "base64", "text", "content", "url", "file")
    if kind not in known:
        tags = ", ".join(f"'{t}'" for t in known)
        return (f"{at}: Input tag '{kind}' found using 'type' does not match any of the"
                f" expected tags: {tags}")
    if kind not in ("base64", "text"):
        # Real sources the API takes, which this fake does not model: refused loudly
        # rather than counted as anything (not the API's behaviour: a test's mistake).
        return f"{at}: the fake Messages API does not model {kind!r} sources"
    return _typed_source_problem(media, str(kind), source)


def _typed_source_problem(media: Media, kind: str, source: dict[str, Any]) -> str | None:
    media_type = source.get("media_type")
    if media.kind == "image":
        at = f"{media.where}.image.source.base64"
        if media_type not in IMAGE_MEDIA_TYPES:
            return (f"{at}.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif'"
                    " or 'image/webp'")
    elif kind == "base64":
        # The API names a base64 PDF document "pdf" in its paths (claude-code#5174:
        # "messages.2.content.0.pdf.source.base64.data: The PDF specified was not valid.").
        at = f"{media.where}.pdf.source.base64"
        if media_type != PDF:
            return f"{at}.media_type: Input should be '{PDF}'"
    else:
        # A text document's path is not in any public report: "document" is a guess.
        at = f"{media.where}.document.source.text"
        if media_type != TEXT:
            return f"{at}.media_type: Input should be '{TEXT}'"
    if "data" not in source:
        return f"{at}.data: Field required"
    if not isinstance(source["data"], str):
        return f"{at}.data: Input should be a valid string"
    return None


def check_media_fields(body: dict[str, Any]) -> str | None:
    """Each image and document block's source has the fields the API requires."""
    for media in media_blocks(body):
        problem = _source_problem(media)
        if problem:
            return problem
    return None


def _decoded(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


# Pillow refuses an image past ~179 megapixels before it says its size, and warns past
# ~89: either has a side past IMAGE_MAX_SIDE whatever its shape (8,000² is 64 megapixels).
_OVERSIZE = (IMAGE_MAX_SIDE + 1, IMAGE_MAX_SIDE + 1)


@lru_cache(maxsize=_VERDICT_CACHE)
def image_verdict(media_type: str, data: str) -> str | tuple[int, int]:
    """An image's size, or what the API says of its bytes (after "...image.source.base64"):
    not the type declared, or not an image it can read. An image within the size limit is
    decoded whole (a cut file is refused); a larger one is refused for its size anyway."""
    raw = _decoded(data)
    if not raw:
        return ".data: Could not process image"
    try:
        with Image.open(io.BytesIO(raw)) as image:
            found = _PILLOW_TYPES.get(str(image.format))
            if found is None:  # a format Pillow reads and the API does not (BMP, TIFF...)
                return ".data: Could not process image"  # a guess: no public report
            if found != media_type:
                return (f": The image was specified using the {media_type} media type, but"
                        f" the image appears to be a {found} image")
            size: tuple[int, int] = image.size
            if max(size) <= IMAGE_MAX_SIDE:
                image.load()
            return size
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        return _OVERSIZE
    except Exception:  # any failure of the reader: the bytes are no image it can use
        return ".data: Could not process image"


@lru_cache(maxsize=_VERDICT_CACHE)
def pdf_page_count(data: str) -> int | None:
    """A base64 PDF's page count, None when it is no PDF the API can read (an encrypted
    one included: the docs require "no passwords/encryption"; the wording is a guess)."""
    raw = _decoded(data)
    if not raw:
        return None
    try:
        reader = PdfReader(io.BytesIO(raw))
        return None if reader.is_encrypted else len(reader.pages)
    except Exception:  # any failure of the reader: not a PDF it can read
        return None


def _image_problem(media: Media, max_side: int, many: bool) -> str | None:
    source = media.block["source"]
    data = source["data"]
    at = f"{media.where}.image.source.base64"
    if len(data) > IMAGE_MAX_BASE64:
        return f"{at}: image exceeds 5 MB maximum: {len(data)} bytes > {IMAGE_MAX_BASE64} bytes"
    verdict = image_verdict(source["media_type"], data)
    if isinstance(verdict, str):
        return at + verdict
    if max(verdict) > max_side:
        which = " for many-image requests" if many else ""
        return (f"{at}.data: At least one of the image dimensions exceed max allowed"
                f" size{which}: {max_side} pixels")
    return None


def check_media(body: dict[str, Any]) -> str | None:
    """The request's files, once their fields are whole (`check_media_fields`): at most
    MAX_IMAGES images, each one an image of its declared type within the size limits
    (smaller past MANY_IMAGES images), each PDF readable, MAX_PDF_PAGES pages in all."""
    found = media_blocks(body)
    images = [m for m in found if m.kind == "image"]
    if len(images) > MAX_IMAGES:
        # Not seen in any public report: the wording is a guess in the API's manner.
        return f"Too many images: {len(images)} > {MAX_IMAGES} maximum"
    many = len(images) > MANY_IMAGES
    max_side = MANY_IMAGES_MAX_SIDE if many else IMAGE_MAX_SIDE
    pages = 0
    for media in found:
        source = media.block["source"]
        if media.kind == "image":
            problem = _image_problem(media, max_side, many)
            if problem:
                return problem
        elif source["type"] == "base64":
            count = pdf_page_count(source["data"])
            if count is None:
                return f"{media.where}.pdf.source.base64.data: The PDF specified was not valid."
            pages += count
    if pages > MAX_PDF_PAGES:
        return f"A maximum of {MAX_PDF_PAGES} PDF pages may be provided."
    return None
