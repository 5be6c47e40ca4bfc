"""Token counts: a long text is counted once by its digest, and always as tiktoken counts it."""

from __future__ import annotations

import tiktoken

from schemas import tokens
from schemas.tokens import OFFLINE_ENCODING, count_tokens


def _direct(text: str) -> int:
    return len(tiktoken.get_encoding(OFFLINE_ENCODING).encode(text, disallowed_special=()))


def test_long_texts_count_as_tiktoken_does_the_first_time_and_every_time_after():
    texts = ["word " * 1_000, "другое слово " * 400, "🙂 " * 2_000, "x" * 1_999 + "y" * 2,
             "<|endoftext|> " * 300]
    for text in texts:
        assert count_tokens(text) == _direct(text)
        assert count_tokens(text) == _direct(text)  # from the kept count


def test_texts_of_one_length_keep_their_own_counts():
    a, b = "a" * 3_000, "a b " * 750
    assert len(a) == len(b)
    assert (count_tokens(a), count_tokens(b)) == (_direct(a), _direct(b))
    assert count_tokens(a) != count_tokens(b)


def test_a_lone_surrogate_is_counted_not_refused():
    text = "\ud800 text " * 400
    assert count_tokens(text) == count_tokens(text) > 0


def test_the_kept_counts_stay_bounded(monkeypatch):
    monkeypatch.setattr(tokens, "_DIGESTS_KEPT", 8)
    for i in range(40):
        count_tokens(f"{i} " + "z" * 2_500)
    assert len(tokens._counted) <= 8
    text = "7 " + "z" * 2_500
    assert count_tokens(text) == _direct(text)
