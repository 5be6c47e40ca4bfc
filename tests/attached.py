"""What the tests of files sent with messages share: real images and PDFs made with Pillow,
and a session's user messages with the names of their files, as the record holds them."""

from __future__ import annotations

import io
from typing import Any

import psycopg
from PIL import Image


def image(width: int, height: int, fmt: str = "PNG", mode: str = "RGB", **save: Any) -> bytes:
    """An image of one colour in format `fmt` (PNG, JPEG, GIF, WEBP), of Pillow's `mode`
    (RGBA: with an alpha channel), saved with Pillow's options `save` (progressive=True,
    lossless=True, ...)."""
    buf = io.BytesIO()
    Image.new(mode, (width, height), (200, 30, 30, 200)[:len(mode)]).save(buf, fmt, **save)
    return buf.getvalue()


def pdf(pages: int) -> bytes:
    """A PDF of `pages` blank pages."""
    buf = io.BytesIO()
    first, *rest = [Image.new("RGB", (60, 80), (255, 255, 255)) for _ in range(pages)]
    first.save(buf, "PDF", save_all=True, append_images=rest)
    return buf.getvalue()


def user_files(database_url: str, session_id: str) -> list[tuple[str, list[str]]]:
    """Each user message's text and the names of the files it carried, in order."""
    with psycopg.connect(database_url) as conn:
        found: list[tuple[str, Any]] = conn.execute(
            "SELECT content_text, content FROM messages WHERE session_id=%s AND type='user'"
            " ORDER BY seq", (session_id,)).fetchall()
    return [(text, [a["name"] for a in (content or {}).get("attachments", [])])
            for text, content in found]
