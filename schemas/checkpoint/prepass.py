"""The cheap pre-pass before a checkpoint: room made without calling a model.

Old tool results shrink to one line, identical ones collapse to a pointer, stale images and
attached files go (named by their lines).
The record is never touched: this works on the rows of the window being assembled, and
the session decides whether the room it made is enough to skip the checkpoint turn.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from schemas.attachments import NOT_RESENT, attachment_line, attachments_of, without_data
from schemas.messages import MessageType, RecordRow
from schemas.tokens import count_tokens

# A tool result this small costs about as much as its one-line summary would.
SHRINK_MIN_TOKENS = 60
SUMMARY_PREVIEW_CHARS = 120
# What one image is assumed to cost in context when it is dropped (about 1,000×1,000 px);
# the record counts text only, so this is an estimate.
IMAGE_TOKENS = 1_600


class PrepassResult(BaseModel):
    rows: list[RecordRow]
    tokens_saved: int
    shrunk: int = 0
    deduped: int = 0
    images_dropped: int = 0


def _one_line(row: RecordRow) -> str:
    text = row.text.strip()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if len(first) > SUMMARY_PREVIEW_CHARS:
        first = first[: SUMMARY_PREVIEW_CHARS - 1].rstrip() + "…"
    lines = text.count("\n") + 1 if text else 0
    error = (isinstance(row.content, dict) and bool(row.content.get("is_error")))
    kind = "tool error" if error else "tool result"
    return (f"[{kind} #{row.seq} shrunk by the pre-pass: \"{first}\" — {lines} lines, "
            f"{row.token_count} tokens; the full text stays in the record]")


def _drop_images(value: Any) -> tuple[Any, int]:
    """The content with every image block replaced by a short text block."""
    if isinstance(value, list):
        out, dropped = [], 0
        for item in value:
            if isinstance(item, dict) and item.get("type") == "image":
                out.append({"type": "text", "text": "[image dropped by the pre-pass]"})
                dropped += 1
            else:
                new, n = _drop_images(item)
                out.append(new)
                dropped += n
        return out, dropped
    if isinstance(value, dict) and isinstance(value.get("content"), list):
        new_content, n = _drop_images(value["content"])
        return {**value, "content": new_content}, n
    return value, 0


def _drop_files(content: Any) -> tuple[Any, int]:
    """A row's attached files let go (`dropped`: no request sends them, each is named by
    its line only), and the tokens that frees; (content, 0) when it has none to let go."""
    items = attachments_of(content)
    going = [item for item in items if not item.get("dropped")]
    if not going:
        return content, 0
    freed = sum(max(found.tokens - count_tokens(attachment_line(found) + NOT_RESENT), 0)
                for found in (without_data(item) for item in going))
    kept = [{k: v for k, v in item.items() if k != "data"} | {"dropped": True}
            for item in items]
    return {**content, "attachments": kept}, freed


def prepass(rows: list[RecordRow], keep_recent_seq: int,
            image_tokens: int = IMAGE_TOKENS) -> PrepassResult:
    """Shrink, dedupe and drop images in rows with seq < keep_recent_seq; newer rows stay.

    A tool result identical to a later one becomes a pointer to that later one (the later
    copy is the one the model last saw); the others shrink to a one-line summary.
    """
    latest_by_text: dict[str, int] = {}
    for row in rows:
        if row.type == MessageType.TOOL_RESULT and row.text.strip():
            latest_by_text[row.text] = row.seq
    out: list[RecordRow] = []
    saved = shrunk = deduped = images = 0
    for row in rows:
        if row.seq >= keep_recent_seq:
            out.append(row)
            continue
        new = row
        content, dropped = _drop_images(row.content)
        if dropped:
            new = new.model_copy(update={"content": content})
            images += dropped
            saved += dropped * image_tokens
        files, freed = _drop_files(row.content)
        if freed:
            new = new.model_copy(update={"content": files,
                                         "token_count": max(row.token_count - freed, 0)})
            images += 1
            saved += freed
        if row.type == MessageType.TOOL_RESULT:
            later = latest_by_text.get(row.text)
            text: str | None = None
            if later is not None and later != row.seq and row.text.strip():
                text = f"[same tool result as #{later}]"
                deduped += 1
            elif row.token_count >= SHRINK_MIN_TOKENS:
                text = _one_line(row)
                shrunk += 1
            if text is not None:
                tokens = count_tokens(text)
                if tokens < row.token_count:
                    saved += row.token_count - tokens
                    new = new.model_copy(update={"text": text, "token_count": tokens})
                elif text.startswith("[same"):
                    deduped -= 1
                else:
                    shrunk -= 1
        out.append(new)
    return PrepassResult(rows=out, tokens_saved=saved, shrunk=shrunk, deduped=deduped,
                         images_dropped=images)
