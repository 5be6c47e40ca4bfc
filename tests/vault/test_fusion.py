"""The hybrid ranking's pure rules (schemas.vault.search): fusion, the dense floor, score
components, snippets, the term ranges and pools the SQL uses."""

from schemas.vault.search import (
    DENSE_FLOOR,
    HYBRID_RRF_K,
    STALE_PENALTY,
    DenseHit,
    Ranked,
    candidate_pool,
    dense_pool,
    fuse,
    snippet_span,
    term_range,
)


def _dense(path, sim, penalised=False):
    return DenseHit(path=path, similarity=sim, chunk=2, start=10, end=20, heading="A > B",
                    penalised=penalised)


def test_fusion_adds_reciprocal_ranks_and_keeps_every_component():
    lexical = [Ranked(path="a", score=9.0, bm25=6.0), Ranked(path="b", score=5.0, bm25=5.0)]
    dense = [_dense("b", 0.8), _dense("c", 0.7)]
    fused = fuse(lexical, dense)
    assert [f.path for f in fused] == ["b", "a", "c"]  # found by both beats first of one
    b = fused[0]
    assert b.score == 1 / (HYBRID_RRF_K + 2) + 0.7 / (HYBRID_RRF_K + 1)
    assert b.components() == {"fused": round(b.score, 6), "lexical_rank": 2.0,
                              "lexical": 5.0, "bm25": 5.0, "dense_rank": 1.0, "dense": 0.8}
    assert b.chunk is not None and (b.chunk.chunk, b.chunk.heading) == (2, "A > B")
    assert "dense" not in fused[1].components()  # a: the lexical ranking's alone


def test_a_dense_only_hit_needs_the_floor_and_a_stale_one_sinks():
    weak = fuse([], [_dense("x", DENSE_FLOOR - 0.01)])
    assert weak == []  # an unrelated query recalls nothing
    clear = fuse([Ranked(path="rent", score=13.0), Ranked(path="summary", score=1.6)],
                 [_dense("summary", DENSE_FLOOR - 0.05), _dense("rent", DENSE_FLOOR - 0.1)])
    assert [f.path for f in clear] == ["rent", "summary"]  # a weak neighbour moves nothing
    assert clear[1].dense_rank is None and clear[1].dense == DENSE_FLOOR - 0.05
    ranked = fuse([], [_dense("old", 0.9, penalised=True), _dense("new", 0.85)])
    assert [f.path for f in ranked] == ["new", "old"]  # superseded: below the fresh one
    assert ranked[1].score == 0.7 / (HYBRID_RRF_K + 1) * STALE_PENALTY


def test_snippets_show_the_chunk_or_the_first_query_word():
    body = "intro line\n" + "filler " * 200 + "\nthe invoice number is 4711\n" + "tail " * 50
    assert snippet_span(body, ["invoice"], 0, 20, 700) == (0, 20)  # a chunk that fits
    a, b = snippet_span(body, ["invoice"], 0, len(body), 100)
    assert body[a:b].startswith("the invoice number") and b - a == 100
    a, b = snippet_span(body, ["decisions"], 0, len(body), 50)  # no match: the start
    assert (a, b) == (0, 50)


def test_term_ranges_and_pools():
    assert term_range("anna") == ("anna", "anna\x01")  # short words: exact
    assert term_range("decisions") == ("decisio", "decisip")  # long ones: their stem
    assert term_range("работает") == ("работа", "работб")
    assert candidate_pool(5) == candidate_pool(1) == 40 and candidate_pool(20) == 80
    assert dense_pool(10) == 50 and candidate_pool(10_000) == 300
