"""How documents are cut into chunks for the dense index (schemas.vault.chunks): pure."""

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.vault.chunks import CHUNK_CHARS, MAX_CHUNKS, chunk_document, chunk_spans
from schemas.vault.rollup import transcript_entry


def _covers(body: str, spans: list[tuple[int, int, str]]) -> bool:
    return (spans[0][0] == 0 and spans[-1][1] == len(body)
            and all(a[1] == b[0] for a, b in pairwise(spans))
            and all(s < e for s, e, _ in spans))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["# Title\n", "## Part\n", "word ", "Sentence ends. ", "\n",
                                 "\n\n", "```\n# not a heading\n```\n", "x" * 300]),
                min_size=1, max_size=60))
def test_chunks_cover_the_body_in_order_and_stay_under_the_limit(parts):
    body = "".join(parts)
    spans = chunk_spans(body, limit=200)
    assert _covers(body, spans)
    assert all(e - s <= 200 for s, e, _ in spans)


def test_headings_give_each_chunk_its_path_and_code_fences_are_not_headings():
    body = ("# Project Atlas\nintro\n## Budget\nmoney talk\n```\n# comment in code\n```\n"
            "### Q3\nnumbers\n## Team\nAnna\n")
    chunks = chunk_document("note", "Atlas", body)
    by_text = {c.heading: body[c.start:c.end] for c in chunks}
    assert by_text["Project Atlas > Budget"].endswith("```\n")  # the fence stays inside
    assert "numbers" in by_text["Project Atlas > Budget > Q3"]
    assert "Anna" in by_text["Project Atlas > Team"]
    team = next(c for c in chunks if c.heading.endswith("Team"))
    assert team.text == "Atlas > Project Atlas > Team\n## Team\nAnna"


def test_a_long_note_is_chunked_to_its_end_with_nothing_cut():
    body = "".join(f"Paragraph {i}: the warehouse scanner batch {i} was checked.\n\n"
                   for i in range(600))  # ~36,000 characters, far past any 4,000 cut
    chunks = chunk_document("note", "Scanners", body)
    assert chunks[-1].end == len(body) and "batch 599" in chunks[-1].text
    assert all(c.end - c.start <= CHUNK_CHARS for c in chunks)
    huge = "word " * 200_000  # a megabyte: fewer, longer chunks, still all of it
    spans = chunk_spans(huge)
    assert len(spans) <= MAX_CHUNKS and _covers(huge, spans)


def test_a_section_of_megabytes_is_chunked_whole() -> None:
    # 4 MB under one heading: ~3,500 first-pass spans (a recursion per span once failed
    # a vault's whole reindex with RecursionError from 1.2 MB on).
    body = "# Pasted log\n" + "aardvark lorem ipsum dolor sit amet " * 120_000
    spans = chunk_spans(body)
    assert len(spans) <= MAX_CHUNKS and _covers(body, spans)


def test_a_transcript_entry_embeds_as_speaker_and_words():
    from datetime import UTC, datetime

    entry = transcript_entry("sess-1", 7, datetime(2026, 6, 1, 9, 30, tzinfo=UTC), "user",
                             "We moved the billing run to Friday.").strip()
    (chunk,) = chunk_document("daily", "2026-06-01 sess-1", entry)
    assert chunk.text == "user: We moved the billing run to Friday."
    assert chunk.heading == "09:30:00 · user"
    assert (chunk.start, chunk.end) == (0, len(entry))
