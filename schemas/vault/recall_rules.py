"""When a turn recalls long memory, and what one recall block may hold. Pure rules.

Invariants: an input with no content word ("continue", "ok", "yes") recalls nothing; a
recall block never shows the same snippet twice (compared with whitespace and case folded).
The session's own messages are never recalled: the search excludes the session
(`exclude_session`), since its live window and checkpoint already carry them.
"""

from __future__ import annotations

import re
from typing import TypeVar

from pydantic import BaseModel

# Recall never surfaces CORE.md (it is in the system prompt already) or MOC.md.
RECALL_KINDS = ["card", "summary", "daily", "note"]
MAX_RECALL_K = 20

# Words that only move the work along, or carry no topic of their own.
MOVE_ALONG_WORDS = frozenset("""
a an and the then so now please pls thanks thank thx you ok okay k kk yes yep yeah yup y no
nope sure fine good great cool nice right alright go on ahead continue proceed carry keep
going next more again do it that this done got lgtm approve approved agreed agree
""".split())

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def content_words(text: str) -> list[str]:
    """The words of `text` that name something: not move-along words, not single letters."""
    return [w for w in _WORD.findall(text.lower())
            if w not in MOVE_ALONG_WORDS and (len(w) > 1 or not w.isascii())]


def wants_recall(query: str) -> bool:
    """Whether a turn with this input searches long memory at all."""
    return bool(content_words(query))


Hit = TypeVar("Hit", bound=BaseModel)


def distinct_snippets(hits: list[Hit], k: int) -> list[Hit]:
    """The first `k` hits whose snippets differ (best first): identical text once."""
    seen: set[str] = set()
    out: list[Hit] = []
    for hit in hits:
        key = " ".join(str(getattr(hit, "snippet", "")).lower().split())
        if key in seen:
            continue
        seen.add(key)
        out.append(hit)
        if len(out) == k:
            break
    return out
