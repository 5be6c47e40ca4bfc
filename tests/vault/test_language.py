"""The language a document is stemmed in (schemas.vault.language): a text's script, or
its function words; English unless the text clearly says otherwise."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.vault.language import SAMPLE_CHARS, STEM_LANGUAGES, stem_language, told_language

WRITTEN = {
    "english": "We moved the database to the new server before Friday, as planned.",
    "spanish": "Ayer hablé con el director y comimos juntos en la plaza del pueblo.",
    "portuguese": "Não sei se ele já chegou, mas a reunião foi adiada para amanhã.",
    "french": "Les chevaux sont dans le pré avec le fermier depuis midi.",
    "italian": "Ho comprato i libri per la scuola e per il corso di storia.",
    "german": "Die Kinder spielen im Garten, und die Häuser sind sehr alt.",
    "dutch": "Het is niet zo dat we de vergadering hebben verplaatst naar morgen.",
    "swedish": "Vi har inte hunnit läsa rapporten, men det är klart till fredag.",
    "danish": "Vi har ikke nået at læse rapporten, men den er klar til fredag.",
    "finnish": "Hän sanoi, että kokous on huomenna, mutta se ei ole varmaa.",
    "turkish": "Bu evler ve kitaplar çok eski, ama hâlâ güzel.",
    "romanian": "Am fost la piață și am cumpărat mere pentru că nu mai aveam.",
    "hungarian": "Azt mondta, hogy a találkozó holnap lesz, de ez még nem biztos.",
    "indonesian": "Saya sudah membaca laporan itu dan akan mengirimkannya besok.",
    "russian": "Я купила две книги и пошла из дома пешком.",
    "greek": "Τα βιβλία είναι στο τραπέζι και τα παιδιά διαβάζουν.",
    "arabic": "قرأت الكتاب في المدرسة أمس مع أصدقائي.",
    "tamil": "நான் நேற்று புத்தகம் வாங்கினேன்.",
}
# Texts no stemmer here fits (or whose script's stemmer is another language's): English.
NO_STEMMER = [
    "我们决定把数据库迁移到新的服务器上。",  # Chinese
    "เราจะย้ายฐานข้อมูลไปยังเซิร์ฟเวอร์ใหม่",  # Thai
    "मैंने कल किताब खरीदी और घर गया।",  # Hindi
    "Chúng tôi đã chuyển cơ sở dữ liệu sang máy chủ mới.",  # Vietnamese
    "Я купила дві книжки і пішла додому пішки.",  # Ukrainian
    "من دیروز کتاب را در مدرسه خواندم.",  # Persian
    "אנחנו מעבירים את מסד הנתונים לשרת חדש.",  # Hebrew
    "", "12 345 678", "ok", "🚀🚀", "src/keel/loader.py:42",
]
# English a function-word count could take for another language.
ENGLISH = [
    "Teams include the Los Angeles Rams, Los Angeles Lakers and the San Diego Padres.",
    "A tropical vacation is always a good idea.",  # `a`: Romanian, Hungarian, Portuguese...
    "Do you like em?",  # `do`, `em`: Portuguese
    "No pets right now. But I do love animals.",
    "Met Peña at the café.",
]


@pytest.mark.parametrize("language", sorted(WRITTEN))
def test_a_text_is_stemmed_in_the_language_it_is_written_in(language):
    assert stem_language(WRITTEN[language]) == language


@pytest.mark.parametrize("text", NO_STEMMER + ENGLISH)
def test_english_unless_the_text_clearly_says_otherwise(text):
    assert stem_language(text) == "english"


def test_a_few_words_of_another_language_in_english_text_do_not_make_it_that_language():
    text = WRITTEN["english"] + " The toast was 'salud y amor', and Das ist gut was the reply."
    assert stem_language(text) == "english"
    assert stem_language(WRITTEN["spanish"] + " OK, thanks!") == "spanish"


def test_every_language_named_is_one_the_function_words_or_a_script_can_name():
    assert set(WRITTEN) == set(STEM_LANGUAGES) - {"norwegian"} | {"english"}
    assert stem_language("Vi har ikke lest rapporten, men den er klar til fredag, og jeg"
                         " skal sende den etter møtet.") in {"norwegian", "danish"}


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.text(max_size=50))
def test_any_text_gets_a_stemmer_named_here_by_its_beginning_only(text, tail):
    got = stem_language(text)
    assert got in STEM_LANGUAGES
    assert stem_language(text) == got
    long = (text + " ") * (SAMPLE_CHARS // (len(text) + 1) + 1)
    assert stem_language(long[:SAMPLE_CHARS] + tail) == stem_language(long[:SAMPLE_CHARS])


def test_a_language_is_told_only_when_the_text_says_it():
    """A query's own language (its stems alone) when the text says it, None when it
    cannot be told: then the query is stemmed in every language its scope holds."""
    for language, text in WRITTEN.items():
        assert told_language(text) == language
    for text in [*NO_STEMMER, "hablo", "Kind", "ok thanks", "Whitfield budget"]:
        assert told_language(text) is None, text
    assert told_language("Where did we put the budget for the launch?") == "english"
