"""The words a text is found by beside PostgreSQL's own: what was said is found by the
words a person would search it with.

Long memory indexes with PostgreSQL's `simple` parser, which keeps a whole run of letters
as one word. Five kinds of what people write are then found by no word of it: Chinese,
Japanese, Thai and the other scripts written without spaces (a sentence is one run);
compound tokens (a path `src/keel/loader.py`, a method `KeelLoader.readAll`, a ticket
`JIRA-4821`, whose number the parser reads as `-4821`, a version `v2.14.3`); words with
accents or compatibility forms searched without them (`café` as `cafe`, `ёж` as `еж`,
full-width `ＡＰＩ`); words written joined or apart (`e-mail` and `email`, `O'Brien` and
`obrien`, `$12,500` and `12500`); and emoji. `extra_terms` writes, for a text, the words
it should also be found by, as text the same parser reads: the runs of a spaceless script
as overlapping character pairs (the usual bigram indexing of CJK search), a compound
token's parts (at separators and at camel case) and its joined form, a word's folded
form, an emoji's code point. A document is indexed with its extra words (minus those the
parser found itself) and a query searches with its own, so both sides meet on the same
words.

Pure and bounded: the extra text of a document is at most `MAX_EXTRA_CHARS` (a tsvector
holds 1 MB); what it leaves out is the end of a very long document, which is still found
by its parser's words. Linear in the text: plain prose goes through the regular
expression engine in one pass, and only the tokens that can add words reach Python.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection, Iterator, Sequence

__all__ = ["MAX_EXTRA_CHARS", "TERMS_VERSION", "extra_terms", "folded_from",
           "without_possessive_s"]

# Bumped when what a document is indexed by changes (what `extra_terms` writes, or the
# database's `memory_doc_tsv`: 2 added the English stems, migration 012; 3 the stems of a
# document's own language, migration 013, and the pairs of Thai and its neighbours by the
# characters a reader sees): documents indexed under an older version are indexed again
# (activities.vault.terms_upgrade).
TERMS_VERSION = 3

MAX_EXTRA_CHARS = 60_000

# Scripts written without spaces between words: Han (with its radicals, compatibility
# and extension blocks), Hiragana, Katakana (and its half-width forms), Hangul (its words
# carry particles: 데이터베이스를), Thai, Lao, Khmer, Myanmar, Tibetan.
_SPACELESS = (
    "\u0e00-\u0eff"  # Thai, Lao
    "\u0f00-\u0fff"  # Tibetan
    "\u1000-\u109f"  # Myanmar
    "\u1100-\u11ff"  # Hangul Jamo
    "\u1780-\u17ff"  # Khmer
    "\u2e80-\u2fdf"  # CJK radicals, Kangxi radicals
    "\u3005-\u3007"  # 々 〆 〇
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3130-\u318f"  # Hangul compatibility Jamo
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff66-\uff9f"  # half-width Katakana
    "\U00020000-\U0003134f"  # CJK extensions B to G
)
_SPACELESS_RUN = re.compile(f"[{_SPACELESS}]+")
# The marks of those scripts written on a letter (Thai, Lao, Khmer, Myanmar, Tibetan vowel
# signs and tones; Japanese voicing marks as separate characters), and a letter with them.
_MARKS = "".join(chr(c) for c in range(0x0E00, 0x3100)
                 if unicodedata.category(chr(c)).startswith("M") and _SPACELESS_RUN.match(chr(c)))
_MARK = re.compile(f"[{_MARKS}]")
_CLUSTER = re.compile(f"[^{_MARKS}][{_MARKS}]*|[{_MARKS}]+")
# Emoji and pictographs (each found by its code point, once a text).
_PICTOGRAPHS = "\u2600-\u27bf\u2b00-\u2bff\U0001f000-\U0001faff"
_PICTOGRAPH = re.compile(f"[{_PICTOGRAPHS}]")
# A token's parts: its runs of letters and digits.
_PART = re.compile(r"[^\W_]+")
# A compound's segments between path, address and query separators (`loader.py` in
# `src/keel/loader.py`, `example.com` in an address), found by the parser as one word.
_SEGMENT = re.compile(r"[^\W_](?:[\w.\-]*[^\W_])?")
# Dotted numbers (versions, addresses) inside a token: `v2.14.3` holds `2.14.3`.
_DOTTED = re.compile(r"(?<![\d.])\d+(?:\.\d+)+")
# Numbers in groups of three: `12,500` is also 12500, `1.000.000` 1000000.
_GROUPED = re.compile(r"(?<![\d.,])\d{1,3}(?:([,.])\d{3})(?:\1\d{3})*(?![\d]|[.,]\d)")
_NOT_DIGIT = re.compile(r"\D")
# Words joined by hyphens (up to four): found written as one word too.
_HYPHENATED = re.compile(r"[^\W\d_]+(?:-[^\W\d_]+){1,3}")
# A name's apostrophe (O'Brien, D'Angelo), not a contraction's (they're, we'll, don't).
_NAME_APOSTROPHE = re.compile(r"(?<![^\W\d_]{2})[^\W\d_]['\u2019][^\W\d_]{3,}")
# Punctuation a token may carry at its edges without being a compound ("Paris?", "(see").
_EDGES = "\"'()[]{}<>.,;:!?*`~|"
# Letters that fold: accented Latin, Greek, ё, compatibility forms (ligatures, full-width,
# super- and subscripts, number forms, circled).
_FOLDABLE = re.compile(
    "[\u00c0-\u024f\u0370-\u03ff\u1f00-\u1fff\u0401\u0451\u2070-\u209f\u2150-\u218f"
    "\u2460-\u24ff\ufb00-\ufb4f\uff01-\uff5e]")
# Words with no extra words, whole tokens with their edge punctuation: a lower-case,
# capitalised or upper-case ASCII word (with an apostrophe's ending), a number; and, when
# the text has no letter that folds, a word of non-ASCII letters.
_OPEN = "[\"'(\\[{<*`]*"
_CLOSE = "[\"'.,;:!?)\\]}>*`]*"
_ASCII_WORD = "[A-Z]?[a-z]+(?:'[a-z]+)?|[A-Z]+|[0-9]+"
_SIMPLE_ASCII = re.compile(rf"(?<!\S){_OPEN}(?:{_ASCII_WORD}){_CLOSE}(?!\S)")
_SIMPLE_ANY = re.compile(rf"(?<!\S){_OPEN}(?:{_ASCII_WORD}|[^\W\d_A-Za-z]+){_CLOSE}(?!\S)")
# What an ASCII token with extra words holds one of: punctuation, an underscore, a capital
# (one class, one scan; non-ASCII letters are checked by _UNUSUAL).
_NOT_PLAIN = re.compile("[^a-z0-9\\s\u0080-\U0010ffff]")
# A character of a spaceless script, a pictograph or a letter that folds (one scan finds
# none in most text that is not ASCII).
_UNUSUAL = re.compile(f"[{_SPACELESS}{_PICTOGRAPHS}{_FOLDABLE.pattern[1:-1]}]")
# Camel case: `readAll` -> read, All; `HTTPServer` -> HTTP, Server; `KeelLoader` -> Keel,
# Loader. Parts of two letters or more are kept.
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")


# Letters whose marks are dropped: Latin and Greek (café, άλφα); and Cyrillic ё, which
# is commonly written е. Other marks make other letters (й is not и) and stay.
_FOLD_BASES = re.compile("[A-Za-z\u00c0-\u024f\u0370-\u03ff\u1f00-\u1fff\u0401\u0451]")


def _folded(word: str) -> str:
    """The word in its compatibility form (full-width ＡＰＩ is API) and without the marks
    of a Latin or Greek letter, nor the diaeresis of ё."""
    out: list[str] = []
    for ch in unicodedata.normalize("NFKC", word):
        if _FOLD_BASES.match(ch):
            ch = "".join(c for c in unicodedata.normalize("NFD", ch)
                         if not unicodedata.combining(c))
        out.append(ch)
    return "".join(out)


def folded_from(lexemes: Sequence[str], written: Collection[str]) -> list[int | None]:
    """For each of a query's lexemes, the 1-based place among them of the word the query
    wrote that it is the folded form of (`cafe` of `café`), or None: a lexeme the query
    wrote itself, or no word's fold. The search looks such a form up only when the word
    as written is held by no document (activities.vault.bm25): where `café` is held, its
    fold would also match every word that differs from it by a mark alone (in Vietnamese,
    `có`, `cô` and `co` are three words). Two written words with one fold: the first
    written names it."""
    place = {lex: i for i, lex in enumerate(lexemes, start=1)}
    own = set(written)
    out: list[int | None] = [None] * len(lexemes)
    for word in (lex for lex in lexemes if lex in own):  # in order: the same every run
        i = place.get(_folded(word))
        if i is not None and lexemes[i - 1] not in own and out[i - 1] is None:
            out[i - 1] = place[word]
    return out


def _pairs(run: str) -> list[str]:
    """Overlapping pairs of a run's characters as a reader sees them: a letter with the
    marks written on it (Thai's vowels and tones above and below) is one; pairs of bare
    code points would index a tone mark and a vowel sign as a word."""
    if not _MARK.search(run):
        return [run] if len(run) == 1 else [run[i:i + 2] for i in range(len(run) - 1)]
    chars = _CLUSTER.findall(run)
    if len(chars) == 1:
        return chars
    return [chars[i] + chars[i + 1] for i in range(len(chars) - 1)]


def _token_terms(token: str) -> list[str]:
    """The extra words of one space-free token (its spaceless runs aside). Most tokens of
    prose have none and leave at the first tests."""
    core = token.strip(_EDGES)
    out: list[str] = []
    if "'" in core or "\u2019" in core:  # they're, Let's: the parser splits these itself
        joined = core.replace("'", "").replace("\u2019", "")
        if _NAME_APOSTROPHE.search(core):  # O'Brien is also found as obrien
            out.append(joined)
        core = joined
    if core.isalnum():  # one word: only camel case or folding can add to it
        if core.isascii():
            if core.islower() or core.isupper() or core[1:].islower() or core.isdigit():
                return out
        elif _FOLDABLE.search(core) is None:
            return out
    parts = _PART.findall(core)
    if len(parts) > 1:  # a compound: its segments, parts, dotted and grouped numbers
        segments = _SEGMENT.findall(core)
        if len(segments) > 1:
            out.extend(s for s in segments if not s.isalnum())
        out.extend(p for p in parts if len(p) > 1 or not p.isascii())
        out.extend(m.group() for m in _DOTTED.finditer(core))
        out.extend(_NOT_DIGIT.sub("", m.group()) for m in _GROUPED.finditer(core))
        if _HYPHENATED.fullmatch(core):  # e-mail, follow-up: also email, followup
            out.append(core.replace("-", ""))
    for part in parts:
        if not part.isascii():
            folded = _folded(part)
            if folded != part:
                out.append(folded)
        if not part.isalpha() or part.islower() or part.isupper():
            continue
        camel = [p for p in _CAMEL.findall(part) if len(p) > 1]
        if len(camel) > 1:
            out.extend(camel)
    return out


# A word's possessive (or contracted) "'s": the parser makes it a word "s" of its own.
_POSSESSIVE_S = re.compile(r"(?<=\w)['\u2019]s\b")


def without_possessive_s(query: str) -> str:
    """A query without its words' possessive 's ("Northwind's" searches as "Northwind"): to
    the parser it is a word "s", rarer than most names and held by any text with another
    possessive, so it ranked an entry that said "Keel's" above the one that named
    Northwind. Queries only: a document's "s" then matches nothing a query asks."""
    return _POSSESSIVE_S.sub("", query)


def extra_terms(text: str, limit: int = MAX_EXTRA_CHARS) -> str:
    """The extra words `text` is found by, space-separated, at most `limit` characters
    (cut at a word). The same function serves documents and queries."""
    if not text:
        return ""
    out: list[str] = []
    size = -1  # the joined length: a space before every word but the first
    for word in _extra_words(text):
        size += len(word) + 1
        if size > limit:
            break
        out.append(word)
    return " ".join(out)


def _extra_words(text: str) -> Iterator[str]:
    rest = text
    foldable = False
    if not text.isascii() and _UNUSUAL.search(text):
        if _SPACELESS_RUN.search(text):
            for m in _SPACELESS_RUN.finditer(text):
                yield from _pairs(m.group())
            rest = _SPACELESS_RUN.sub(" ", text)
        seen: set[str] = set()
        for ch in _PICTOGRAPH.findall(text):
            if ch not in seen:
                seen.add(ch)
                yield f"u{ord(ch):x}"
        foldable = _FOLDABLE.search(rest) is not None
    if not foldable and _NOT_PLAIN.search(rest) is None:
        return  # lower-case words of any alphabet, digits: nothing to add (one scan)
    # The words of prose that have no extra words go in one pass of the regular expression
    # engine; Python sees only the tokens left.
    simple = _SIMPLE_ASCII if foldable else _SIMPLE_ANY
    for token in simple.sub(" ", rest).split():
        yield from _token_terms(token)
