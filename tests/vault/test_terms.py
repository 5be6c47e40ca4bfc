"""The extra search words (schemas.vault.terms), without a server: what each kind of
text adds, that a plain word adds nothing, that any text gives a bounded answer."""

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.vault.terms import MAX_EXTRA_CHARS, extra_terms


def words(text: str) -> list[str]:
    return extra_terms(text).split()


def test_spaceless_scripts_are_found_by_character_pairs():
    assert words("数据库迁移") == ["数据", "据库", "库迁", "迁移"]
    assert words("会") == ["会"]  # a run of one is itself
    assert words("来週の会議") == ["来週", "週の", "の会", "会議"]
    assert "ฐา" in words("ฐานข้อมูล")
    # A letter with the marks written on it is one character: `ข้อ`, not `ข้` and `้อ`.
    assert words("ฐานข้อมูล") == ["ฐา", "าน", "นข้", "ข้อ", "อมู", "มูล"]
    assert words("ได้กี่") == ["ได้", "ด้กี่"]
    assert "베이" in words("데이터베이스를")
    # Runs inside a compound token are paired apart from its Latin parts.
    assert words("数据库API调用") == ["数据", "据库", "调用"]


def test_compound_tokens_are_found_by_their_parts():
    assert words("src/keel/loader.py") == ["loader.py", "src", "keel", "loader", "py"]
    assert "4821" in words("JIRA-4821.")  # the parser reads the number as -4821
    got = words("v2.14.3 on 10.0.4.17")
    assert "2.14.3" in got and "10.0.4.17" in got and "14" in got
    assert words("anna.petrova@example.com")[:2] == ["anna.petrova", "example.com"]
    assert words("parse_config_file") == ["parse", "config", "file"]
    assert "12500" in words("$12,500") and "1000000" in words("1.000.000")
    assert "125" not in words("1,25") and "10.0.4.17" in words("10.0.4.17")


def test_joined_words_are_found_written_as_one():
    assert "email" in words("e-mail") and "followup" in words("follow-up")
    assert "state-of-the-art" not in words("state-of-the-art-thing")  # parts only
    assert words("O'Brien") == ["OBrien"]
    assert words("they're we'll don't Let's") == []  # the parser splits contractions


def test_camel_case_is_split_where_a_person_reads_words():
    assert words("readAll") == ["read", "All"]
    assert words("HTTPServer") == ["HTTP", "Server"]
    assert words("parseJSON") == ["parse", "JSON"]
    assert "Loader" in words("KeelLoader.readAll()")


def test_accents_and_compatibility_forms_are_folded_where_a_person_drops_them():
    assert words("café naïve") == ["cafe", "naive"]
    assert words("Ёлка") == ["Елка"]
    assert words("ＡＰＩ") == ["API"]
    assert words("άλφα") == ["αλφα"]
    assert words("йогурт") == []  # й is not и: left as written


def test_emoji_are_found_by_their_code_point_once():
    assert words("Deploy 🚀 went 🚀 fine ✅") == ["u1f680", "u2705"]


def test_plain_words_add_nothing():
    assert extra_terms("The deploy is Friday, at 10 in the morning. OK?") == ""
    assert extra_terms("") == ""


def test_the_extra_words_are_bounded_and_cut_at_a_word():
    text = "数据库迁移到新的服务器" * 20_000
    out = extra_terms(text)
    assert 0 < len(out) <= MAX_EXTRA_CHARS
    assert all(len(w) == 2 for w in out.split())
    assert len(extra_terms(text, limit=10)) <= 10


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=300),
       st.integers(min_value=0, max_value=200))
def test_any_text_gives_words_within_the_limit(text, limit):
    out = extra_terms(text, limit=limit)
    assert len(out) <= limit
    assert out == out.strip() and "  " not in out
    assert extra_terms(text, limit=limit) == out  # the same words every time


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0x0E00, max_codepoint=0x0E7F), max_size=40))
def test_no_pair_of_a_spaceless_run_starts_with_a_mark_its_run_did_not(text):
    import unicodedata

    for word in words(text):
        if unicodedata.category(word[0]).startswith("M"):
            assert text.lstrip().startswith(word[0]), (text, word)



def test_a_query_lexeme_names_the_written_word_it_is_the_fold_of():
    from schemas.vault.terms import folded_from

    assert folded_from(["café", "cafe", "noon"], ["café", "noon"]) == [None, 1, None]
    # A fold the query also wrote itself is its own word.
    assert folded_from(["café", "cafe"], ["café", "cafe"]) == [None, None]
    assert folded_from(["ёлка", "елка"], ["ёлка"]) == [None, 1]
    assert folded_from(["có", "cô", "co"], ["có", "cô"]) == [None, None, 1]
    assert folded_from(["plain"], ["plain"]) == [None]
    # Two written words with one fold: the first written names it, whatever the set order.
    assert folded_from(["café", "cafè", "cafe"], ["cafè", "café"]) == [None, None, 1]


def test_a_query_s_possessive_s_goes_and_nothing_else_does() -> None:
    from schemas.vault.terms import without_possessive_s

    assert without_possessive_s("Northwind's employer") == "Northwind employer"
    assert without_possessive_s("Dana’s car's colour") == "Dana car colour"
    for kept in ("O'Brien", "s'il vous plaît", "the 's'", "'s", "rock 'n' roll"):
        assert without_possessive_s(kept) == kept
