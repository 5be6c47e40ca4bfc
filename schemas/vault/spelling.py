"""Spelling: which word memory holds that a searched word memory lacks was meant as.

A person searching their memory misspells (`recieve`, `deploymnet`, a name with one letter
doubled or missing); a word that is in no document finds nothing, so the search then rests
on the query's other words or finds nothing at all. The classic correction (Damerau's
single edit; Norvig's corrector) asks which words one edit away are known, and takes the
most frequent: here "known" is memory's own vocabulary (`memory_terms`), and frequency is
a word's document frequency in the scope.

Invariants:
- Only a word memory lacks is ever corrected (the caller checks; a known word, even a rare
  one or a real-word slip like `form` for `from`, is searched as written).
- A candidate is exactly one edit away: a letter deleted, two neighbours swapped, a letter
  replaced or inserted, over the letters of the word's own script (Latin with its accented
  letters, Greek, Cyrillic). Words of other scripts, of digits or mixed, and words under
  `MIN_LETTERS` or over `MAX_LETTERS` letters are not corrected: a script written without
  spaces is searched by character pairs (schemas.vault.terms), where one edit is another
  word, and a short word is one edit from too many.
- The choice is deterministic: a candidate memory holds as a word of its own before one it
  holds only by its light stem's prefix (as BM25 looks a long word up: `decisions` finds
  `decision`; the caller then searches the word memory holds), then the one in the most
  documents, then the first in code-point order.
- Pure and bounded: at most `54 n + 25` candidates for an n-letter word of a-z; each
  distinct letter of the word outside its script's base alphabet adds `2 n + 1` more.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["MAX_CORRECTED", "MAX_LETTERS", "MIN_LETTERS", "best_correction", "correctable",
           "edit_distance", "nearest", "one_edit"]

MIN_LETTERS = 4
MAX_LETTERS = 24
# A query's words that are tried at most (a search's query is a few words; a pasted
# paragraph's first unknown words are corrected, the rest searched as written).
MAX_CORRECTED = 8

_LATIN = "abcdefghijklmnopqrstuvwxyz"
_GREEK = "αβγδεζηθικλμνξοπρστυφχψωάέήίόύώϊϋΐΰς"
_CYRILLIC = "абвгдежзийклмнопрстуфхцчшщъыьэюяё"


def _script(ch: str) -> str | None:
    if "a" <= ch <= "z" or ("\u00df" <= ch <= "\u024f" and ch not in "\u00f7"):
        return "latin"
    if "\u0370" <= ch <= "\u03ff" or "\u1f00" <= ch <= "\u1fff":
        return "greek"
    if "\u0400" <= ch <= "\u052f":
        return "cyrillic"
    return None


def _alphabet(word: str) -> str | None:
    """The letters an edit of `word` may use: its script's, with the word's own (an
    accented or rarer letter it holds); None when it is not one script's letters."""
    scripts = {_script(ch) for ch in word}
    if len(scripts) != 1 or None in scripts or not word.isalpha():
        return None
    base = {"latin": _LATIN, "greek": _GREEK, "cyrillic": _CYRILLIC}[scripts.pop() or ""]
    return base + "".join(sorted(set(word) - set(base)))


def correctable(word: str) -> bool:
    """Whether a word memory lacks is looked for one edit away (lower case, as indexed)."""
    return MIN_LETTERS <= len(word) <= MAX_LETTERS and word == word.lower() \
        and _alphabet(word) is not None


def one_edit(word: str) -> list[str]:
    """Every word one edit from `word` (deleted, swapped, replaced, inserted), in a fixed
    order, without `word` itself; [] for a word `correctable` refuses."""
    if not correctable(word):
        return []
    letters = _alphabet(word) or ""
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    out: dict[str, None] = {}
    for a, b in splits:
        if b:
            out[a + b[1:]] = None  # deleted
        if len(b) > 1:
            out[a + b[1] + b[0] + b[2:]] = None  # swapped
        for ch in letters:
            if b:
                out[a + ch + b[1:]] = None  # replaced
            out[a + ch + b] = None  # inserted
    out.pop(word, None)
    return list(out)


def best_correction(word: str, known: Mapping[str, tuple[int, int]]) -> str | None:
    """The candidate to search for `word`, or None when memory holds none. `known`:
    candidate -> (documents holding it as a word of its own, documents holding a word it
    finds as BM25 looks it up); the candidates memory lacks left out or at (0, 0)."""
    found = [(exact, df, cand) for cand, (exact, df) in known.items()
             if df > 0 and cand != word]
    if not found:
        return None
    return min(found, key=lambda f: (-f[0], -f[1], f[2]))[2]


def edit_distance(a: str, b: str) -> int:
    """Edits from `a` to `b`, a swap of neighbours counting one (optimal string alignment)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return prev[len(b)]


def nearest(word: str, held: list[str]) -> str:
    """Of the words memory holds that a candidate finds by its stem's prefix (`held`, the
    commonest first), the one closest to what was written, then the commonest: a stem
    (`decis`) is not shown for `decisons` when `decision` is there."""
    return min(enumerate(held), key=lambda h: (edit_distance(word, h[1]), h[0]))[1]
