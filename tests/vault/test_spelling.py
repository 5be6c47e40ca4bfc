"""The spelling rule (schemas.vault.spelling), without a database: which words are tried,
their candidates one edit away, and which candidate wins."""

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.vault.spelling import (
    MAX_LETTERS,
    MIN_LETTERS,
    best_correction,
    correctable,
    edit_distance,
    nearest,
    one_edit,
)


def _distance(a: str, b: str) -> int:
    """Optimal string alignment distance (an adjacent swap is one edit), the reference."""
    d = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        d[i][0] = i
    for j in range(len(b) + 1):
        d[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def test_which_words_are_tried():
    for word in ("recieve", "deploymnet", "café", "привет", "καλημέρα", "straße", "naïve"):
        assert correctable(word), word
    for word in ("the", "v2", "4821", "数据库迁移", "데이터베이스", "Recieve", "abc_def",
                 "mixedпривет", "x" * (MAX_LETTERS + 1), "x" * (MIN_LETTERS - 1), ""):
        assert not correctable(word), word


def test_the_candidates_are_every_word_one_edit_away():
    cands = one_edit("recieve")
    assert "receive" in cands  # swapped
    assert "recive" in cands  # deleted
    assert "relieve" in cands  # replaced
    assert "recieves" in cands  # inserted
    assert "recieve" not in cands
    assert len(cands) == len(set(cands)) <= 54 * 7 + 25
    assert all(_distance("recieve", c) == 1 for c in cands)
    # The word's own script: Cyrillic letters for a Cyrillic word, its accented letters kept.
    assert "привет" in one_edit("превет") and all(
        c.isalpha() and not any("a" <= ch <= "z" for ch in c) for c in one_edit("превет"))
    assert "cafe" in one_edit("cafè")  # accents are folded in the index: café is cafe too
    assert one_edit("数据库迁移") == [] and one_edit("the") == []


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyzéß", min_size=MIN_LETTERS,
               max_size=12))
def test_every_single_edit_is_a_candidate(word):
    """Each of the four edits at every place, over the word's alphabet, is among the
    candidates, and every candidate is one edit away: nothing missed, nothing further."""
    cands = set(one_edit(word))
    alphabet = set("abcdefghijklmnopqrstuvwxyz") | set(word)
    expected = set()
    for i in range(len(word) + 1):
        a, b = word[:i], word[i:]
        if b:
            expected.add(a + b[1:])
            expected |= {a + ch + b[1:] for ch in alphabet}
        if len(b) > 1:
            expected.add(a + b[1] + b[0] + b[2:])
        expected |= {a + ch + b for ch in alphabet}
    expected.discard(word)
    assert cands == expected
    assert all(_distance(word, c) == 1 for c in cands)


def test_the_candidate_chosen():
    # A word of its own beats one held only by its stem's prefix, then more documents win,
    # then code-point order; nothing held, nothing chosen.
    assert best_correction("recieve", {"receive": (3, 5), "relieve": (9, 9)}) == "relieve"
    assert best_correction("deploymnet", {"deployment": (4, 4), "deploymet": (0, 4)}) \
        == "deployment"
    assert best_correction("recieve", {"receive": (2, 2), "recieve": (7, 7)}) == "receive"
    assert best_correction("abcd", {"abce": (1, 1), "abcf": (1, 1)}) == "abce"
    assert best_correction("abcd", {"abce": (0, 0)}) is None
    assert best_correction("abcd", {}) is None


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abcde", max_size=8), st.text(alphabet="abcde", max_size=8))
def test_the_edit_distance_is_the_reference(a, b):
    assert edit_distance(a, b) == _distance(a, b)


def test_the_word_shown_for_a_stem_match_is_the_nearest_held():
    assert nearest("decisons", ["decis", "decision", "decisive"]) == "decision"
    assert nearest("abcd", ["abce", "abcf"]) == "abce"  # equally near: the commoner
