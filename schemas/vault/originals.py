"""A message's files kept in its memory scope's vault, as the seed's layout has them: the
originals by date, `attachments/YYYY-MM-DD/<digest>-<name>`, each linked from the day's
transcript entry under the line that names it. No I/O.

Invariants:
- An original's path is its content's (`original_path`): the day of the entry that links
  it, the first 12 hex digits of its sha256 and its name made safe for every file system
  (Windows' reserved characters, control characters, a leading dot; at most
  `NAME_CHARS` characters, its extension kept). The same file sent twice on a day is kept
  once; two files of one name and other bytes are two originals.
- A transcript entry names each file by its line (`schemas.attachments.attachment_line`)
  and links its original below it, relative to the daily file (`entry_text`): an image or
  a PDF as an embed, so a person reading the day's transcript in Obsidian sees it; text as
  a link.
- What an entry links is read back by one rule (`linked_originals`) that takes only a link
  of exactly that form into the entry's own day's folder: words of a message that look
  like a link to elsewhere in the vault (`../CORE.md`, `../attachments/../x`) are never
  taken for one. Forgetting a session deletes the originals its entries linked that no
  entry left links.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any
from urllib.parse import quote, unquote

from schemas.attachments import IMAGE_TYPES, PDF, attachment_line, without_data
from schemas.vault.schema import DAILY_DIR

__all__ = ["NAME_CHARS", "ORIGINALS_DIR", "daily_day", "entry_text", "linked_originals",
           "original_path"]

ORIGINALS_DIR = "attachments"
NAME_CHARS = 100
DIGEST_CHARS = 12

_UNSAFE = re.compile(r'[\\/:*?"<>|#^\[\]%\x00-\x1f\x7f]')
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
# A link to an original, as `entry_text` writes it: `](../attachments/<day>/<digest>-<name>)`.
_LINK = re.compile(r"\]\(\.\./" + ORIGINALS_DIR + r"/(\d{4}-\d{2}-\d{2})/([0-9a-f]{"
                   + str(DIGEST_CHARS) + r"}-[^()\s/]+)\)")


def _safe_name(name: str) -> str:
    """`name` as a file name every file system and Obsidian's links take."""
    name = _UNSAFE.sub("_", name).strip().lstrip(".") or "file"
    if len(name) <= NAME_CHARS:
        return name
    stem, ext = posixpath.splitext(name)
    ext = ext if len(ext) <= 10 else ""
    return stem[:NAME_CHARS - len(ext)] + ext


def original_path(day: str, item: dict[str, Any]) -> str:
    """The vault path of a stored attachment's original, linked from `day`'s transcript."""
    if not _DAY.fullmatch(day):
        raise ValueError(f"{day!r} is not a day (YYYY-MM-DD)")
    found = without_data(item)
    return f"{ORIGINALS_DIR}/{day}/{found.sha256[:DIGEST_CHARS]}-{_safe_name(found.name)}"


def _link(day: str, item: dict[str, Any]) -> str:
    found = without_data(item)
    label = _UNSAFE.sub("_", found.name)
    target = quote(f"../{original_path(day, item)}", safe="/")
    embed = "!" if found.media_type in (*IMAGE_TYPES, PDF) else ""
    return f"{embed}[{label}]({target})"


def entry_text(text: str, items: Any, day: str) -> str:
    """A message's words as the day's transcript keeps them: the words, then each file's
    line with its original's link below it (`items`: the row's stored attachments, with or
    without their bytes)."""
    files = [item for item in items or [] if isinstance(item, dict)]
    lines = [f"{attachment_line(without_data(item))}\n{_link(day, item)}" for item in files]
    return "\n".join([text, *lines] if text else lines)


def linked_originals(entry: str, day: str) -> set[str]:
    """The vault paths of the originals an entry of `day`'s transcript links (only links of
    `entry_text`'s form into that day's folder)."""
    found = set()
    for m in _LINK.finditer(entry):
        name = unquote(m.group(2))
        if m.group(1) == day and not _UNSAFE.search(name):
            found.add(f"{ORIGINALS_DIR}/{day}/{name}")
    return found


def daily_day(rel: str) -> str | None:
    """The day a daily transcript's vault path is of (`daily/YYYY-MM-DD.md`), else None."""
    folder, _, file = rel.partition("/")
    day = file.removesuffix(".md")
    return day if folder == DAILY_DIR and file.endswith(".md") and _DAY.fullmatch(day) else None
