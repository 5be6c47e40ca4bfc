"""The language a document's words are stemmed in: which of PostgreSQL's Snowball
stemmers fits its text.

Long memory finds an inflected word by its stem (`compramos` by `compré`, `книгу` by
`книги`), and a stemmer is a language's: English's leaves Spanish and Russian words as
they are. A document is stemmed in the language its text is written in; a query is
looked up by its words' stems in English and in every language its scope holds
documents in when its own language cannot be told (activities.vault.bm25), so the two
sides meet on the stem whichever language a short query is in; a query clearly in one
language is stemmed in that one alone (an English question's words are not also cut by
six other stemmers into stems of other languages' words).

Invariants:
- Pure, bounded and deterministic: the first `SAMPLE_CHARS` characters decide, and the
  same text always gets the same language.
- Only stemmers every supported server has (PostgreSQL 12 and later ship each
  configuration named in `STEM_LANGUAGES`): a language named here can always be indexed.
- `english` unless the text says otherwise, as before languages were told apart: a text
  in a script with a stemmer here (Cyrillic as Russian, Greek, Arabic, Tamil) when most
  of its letters are that script's, and Latin text in another language only when that
  language's own function words outnumber English's (and there are at least two).
  Scripts with no stemmer here (Chinese, Thai, Hindi, Hebrew...), and the languages of
  a script whose stemmer would be another language's (Ukrainian, Serbian, Persian, Urdu),
  stay `english`: their words are found by themselves, and the English words among them
  by English stems. Hindi has a Snowball stemmer (PostgreSQL 16), which lost a point on
  XQuAD's Hindi questions (bench/bench_languages.py).
"""

from __future__ import annotations

import re
from collections import Counter

__all__ = ["SAMPLE_CHARS", "STEM_LANGUAGES", "stem_language", "told_language"]

# A text's beginning says its language: some 300 words for its function words, and fewer
# letters for its script (a script is the same throughout). A chat message is read whole
# in ~15 us; a long note's beginning in ~80 us (Latin) to ~200 us.
SAMPLE_CHARS = 2_000
SCRIPT_CHARS = 500

# A language's commonest function words: a text's share of them says what it is written
# in (they are what a language repeats in any subject). Words several languages share
# count for each of them.
_FUNCTION_WORDS: dict[str, str] = {
    "english": "the and of to is that it was for with you this are have be not what they his"
               " her which were from would there their been has will when who how did does"
               " my we an but or at by on your can he she me our a as do no so if its it's i'm"
               " don't just like about all get got yeah really that's am too very some",
    "spanish": "el los las que del por con para una es se su sus al lo como más pero fue"
               " este esta ha porque entre cuando muy sin sobre también hasta hay donde qué"
               " y un la de en no yo está son ese eso ella tiene era",
    "portuguese": "o os as que do da dos das em no na nos nas um uma é não com para por mais"
                  " mas ao se seu sua foi como também ou ele ela está são já muito quando"
                  " isso pelo pela e de à tem há eu você",
    "french": "le la les des du un une et est que qui dans pour pas au aux sur avec ce cette"
              " il elle sont ne se par plus ont été mais ou nous vous je son sa ses leur"
              " être fait très",
    "italian": "il lo la gli le di del della dei delle che è e un una per con non si sono"
               " nel nella al alla da come ma più anche ha questo questa era loro suo sua io"
               " mi ci",
    "german": "der die das und ist nicht ein eine einen dem den des zu mit sich auf für von"
              " im auch es ich sie er wir wird werden wurde sind war hat haben oder aber"
              " noch nach bei aus wie über dass nur kann wenn einer",
    "dutch": "de het een en van is dat op te zijn niet met voor die er maar om aan ook als"
             " bij door naar dan nog wat ze hij ik wordt werd heeft hebben kan wel zo uit"
             " deze dit meer over",
    "swedish": "och att det som en ett är av för på med till den har de inte om var jag vi"
               " hon han men från sig vid kan så eller också när efter under skulle detta"
               " mycket hade blev finns",
    "danish": "og at det er en af til den på med som de for ikke har et var jeg vi hun han"
              " men fra sig kan så eller også når efter under skulle dette meget havde"
              " blev hvor deres",
    "norwegian": "og å det er en av til den på med som de for ikke har et var jeg vi hun han"
                 " men fra seg kan så eller også når etter under skulle dette mye hadde ble"
                 " hvor deres",
    "finnish": "ja on ei se että oli ovat kun mutta myös niin hän joka jotka tai kuin mukaan"
               " sen sitä ole olla vain nyt minä sinä me te he tämä tuo mitä kanssa jälkeen"
               " ennen vuonna",
    "turkish": "ve bir bu da de için ile olarak çok daha gibi en ama ancak sonra kadar o ne"
               " mi mı ben sen biz siz onlar var yok olan oldu olduğu ise şu her veya değil"
               " göre üzere",
    "romanian": "și în de la cu pe nu o un care este sunt a al ai ale din că se mai ce"
                " pentru fost sau dar fi lui ei după ca prin au către această acest am eu"
                " el ea",
    "hungarian": "a az és hogy nem is egy ez meg de van volt csak már mint még el ki be fel"
                 " le vagy kell lesz ha azt ezt után között szerint amely amit én te ő mi ők",
    "indonesian": "yang dan di ke dari ini itu dengan untuk tidak dalam pada adalah akan juga"
                  " saya kami kita mereka ada oleh atau sudah bisa karena tetapi telah"
                  " sebagai lebih seperti jika dia apa bahwa",
}
_WORDS: dict[str, frozenset[str]] = {k: frozenset(v.split()) for k, v in _FUNCTION_WORDS.items()}
# One ASCII letter (a, o, e, y) is a word in half these languages and an initial in all:
# not counted.
_LANGUAGES_OF: dict[str, tuple[str, ...]] = {
    word: tuple(lang for lang, words in _WORDS.items() if word in words)
    for word in set().union(*_WORDS.values()) if len(word) > 1 or not word.isascii()}

# Letters only one of these languages writes: each one a text holds counts as a function
# word of its language (a short message has few of those).
_LETTERS = {"ñ": "spanish", "¿": "spanish", "¡": "spanish", "ß": "german", "ã": "portuguese",
            "õ": "portuguese", "ğ": "turkish", "ı": "turkish", "ş": "turkish",
            "ă": "romanian", "ș": "romanian", "ț": "romanian", "ő": "hungarian",
            "ű": "hungarian", "œ": "french"}

# Scripts with a stemmer of their own here, by the first word of their letters' Unicode
# names; and the letters that say a Cyrillic or Arabic text is in another language, whose
# words those stemmers would cut wrongly (Ukrainian, Belarusian, Serbian, Macedonian;
# Persian, Urdu).
_SCRIPTS = {"CYRILLIC": "russian", "GREEK": "greek", "ARABIC": "arabic", "TAMIL": "tamil"}
_SCRIPT_LETTERS = {
    "LATIN": re.compile("[a-z\u00c0-\u024f\u1e00-\u1eff]"),
    "CYRILLIC": re.compile("[\u0400-\u052f]"),
    "GREEK": re.compile("[\u0370-\u03ff\u1f00-\u1fff]"),
    "ARABIC": re.compile("[\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff\ufb50-\ufdff"
                         "\ufe70-\ufeff]"),
    "TAMIL": re.compile("[\u0b80-\u0bff]"),
}
_LETTER = re.compile(r"[^\W\d_]")
_NOT_RUSSIAN = frozenset("іїєґўђјљњћџѓќѕ")
_NOT_ARABIC = frozenset("پچژگکیےٹڈڑںھ")

STEM_LANGUAGES: tuple[str, ...] = tuple(sorted({*_WORDS, *_SCRIPTS.values()}))

_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?")
# Vietnamese writes Latin letters with marks no other language here does (ơ, ư, đ and the
# tone-marked vowels of Latin Extended Additional); no stemmer here fits its words.
_VIETNAMESE = re.compile("[ơưđ\u1ea0-\u1ef9]")


def _scripts(sample: str) -> tuple[str, int, int]:
    """The script most of `sample`'s letters are in (LATIN, one with a stemmer here, or
    OTHER), how many letters it has, and how many letters there are (relative counts:
    the first SCRIPT_CHARS characters are counted)."""
    if 4 * (len(sample) - len(sample.encode("ascii", "ignore"))) < len(sample):
        return "LATIN", len(sample), len(sample)  # mostly ASCII: English letters, code
    sample = sample[:SCRIPT_CHARS]
    letters = len(_LETTER.findall(sample))
    counts = {name: len(pattern.findall(sample)) for name, pattern in _SCRIPT_LETTERS.items()}
    script = max(counts, key=lambda name: counts[name])
    if counts[script] < letters - sum(counts.values()):  # the scripts with no stemmer here
        return "OTHER", 0, letters
    return script, counts[script], letters


def _votes(text: str) -> Counter[str]:
    """Each language's function words in `text`: the words written in lower case, and
    the first (`Los Angeles` in an English text is a name, not Spanish)."""
    words = _WORD.findall(text)
    if words:
        words[0] = words[0].lower()
    votes: Counter[str] = Counter()
    for word in words:
        for language in _LANGUAGES_OF.get(word, ()):
            votes[language] += 1
    return votes


def stem_language(text: str) -> str:
    """The Snowball stemmer (a PostgreSQL text-search configuration) for `text`'s words:
    the language it is written in, English when that cannot be told."""
    return told_language(text) or "english"


def told_language(text: str) -> str | None:
    """The language `text` is clearly written in, of those with a stemmer here; None when
    it cannot be told (too few words, or a script with no stemmer here)."""
    sample = text[:SAMPLE_CHARS].lower()
    script, count, letters = _scripts(sample)
    if not letters:
        return None
    if script != "LATIN":
        language = _SCRIPTS.get(script)
        if language is None or 2 * count <= letters:
            return None
        barred = {"russian": _NOT_RUSSIAN, "arabic": _NOT_ARABIC}.get(language, frozenset())
        return None if barred.intersection(sample) else language
    if len(_VIETNAMESE.findall(sample)) * 20 > count:
        return None
    votes = _votes(text[:SAMPLE_CHARS])
    for ch in set(sample).intersection(_LETTERS):
        votes[_LETTERS[ch]] += 1
    english = votes.pop("english", 0)
    # Ties go to the language listed first above (a fixed order: deterministic).
    best = max(votes, key=lambda lang: (votes[lang], -list(_WORDS).index(lang)), default="")
    if best and votes[best] >= 2 and votes[best] > english:
        return best
    return "english" if english >= 2 and english >= votes.get(best, 0) else None
