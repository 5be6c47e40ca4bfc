"""Search ranking rules that do not need the database: query terms, graph rerank, fusion,
snippets.

Okapi BM25 itself runs in SQL (activities/vault/search.py) because it needs the corpus
statistics, and so does the dense (cosine) search; what happens to their rankings afterwards
is decided here. Invariants: the fused order is reciprocal rank fusion of the lexical order
(BM25 with the graph rerank) and the dense order, ties broken by best rank then path; every
fused hit carries the components it was ranked by; a document found by the dense search
alone must reach `DENSE_FLOOR` cosine similarity, so an unrelated query recalls nothing.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass

BM25_K1 = 1.2
BM25_B = 0.75
# Column weights, by tsvector weight letter: title over tags over body.
COLUMN_WEIGHTS = {"A": 3.0, "B": 2.0, "C": 1.5, "D": 1.0}
# Documents each informative query term may bring to BM25 scoring: enough for the hits
# asked for, whatever the scope's size (a pool of most of a small scope made it slow).
MIN_POOL = 40
POOL_PER_HIT = 4
CANDIDATE_POOL = 300
# Documents the dense search hands to the fusion.
DENSE_MIN_POOL = 30
DENSE_PER_HIT = 5
COVERAGE_FLOOR = 0.3
# Multipliers for the top 3 hits themselves, their neighbours, and neighbours' neighbours.
HOP_FACTORS = (1.5, 1.3, 1.15)
GRAPH_SEEDS = 3
LINK_BOOST = 0.1
STALE_PENALTY = 0.3
RRF_K = 60
# Hybrid fusion, tuned on bench/bench_recall.py (REALTALK; 10..20 and 0.5..1.0 all within a
# point of the best): a small k lets the top ranks of each list count, and the dense ranking
# (a static model) weighs a little less than the lexical one.
HYBRID_RRF_K = 10
# How deep into the lexical ranking the fusion reads (a rank past it adds under 1/110).
FUSE_DEPTH = 100
LEXICAL_WEIGHT = 1.0
DENSE_WEIGHT = 0.7
# The least cosine similarity at which a document found by the dense search alone is a hit
# (the built-in model: unrelated text tops out near 0.25-0.45, an answer near 0.6).
DENSE_FLOOR = 0.45
# Words this short keep their exact form; longer ones also match their variants by prefix.
STEM_MIN_LEN = 6
STEM_KEEP = 5


def candidate_pool(k: int) -> int:
    """How many documents each query term may bring to BM25 scoring for k hits."""
    return min(CANDIDATE_POOL, max(MIN_POOL, POOL_PER_HIT * k))


def dense_pool(k: int) -> int:
    """How many documents the dense search ranks for k hits."""
    return min(CANDIDATE_POOL, max(DENSE_MIN_POOL, DENSE_PER_HIT * k))


def stem_prefix(lexeme: str) -> str | None:
    """A language-agnostic light stem: a long word also matches words sharing its start.

    Dropping up to two final letters lets "decisions" find "decision" and "работает" find
    "работал" without a per-language dictionary. Short words and non-letters stay exact.
    """
    if len(lexeme) < STEM_MIN_LEN or not lexeme.isalpha():
        return None
    return lexeme[: max(STEM_KEEP, len(lexeme) - 2)]


def like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def term_patterns(lexemes: list[str]) -> list[tuple[str, str, str]]:
    """(lexeme, LIKE pattern, tsquery item) for each distinct query lexeme, in order."""
    out: list[tuple[str, str, str]] = []
    for lex in dict.fromkeys(lexemes):
        quoted = "'" + lex.replace("\\", "\\\\").replace("'", "''") + "'"
        stem = stem_prefix(lex)
        if stem is None:
            out.append((lex, like_escape(lex), quoted))
        else:
            stem_q = "'" + stem.replace("\\", "\\\\").replace("'", "''") + "'"
            out.append((lex, like_escape(stem) + "%", f"{stem_q}:*"))
    return out


def term_range(lexeme: str) -> tuple[str, str]:
    """[lo, hi) in byte order holding every term `term_patterns` matches for the lexeme:
    the lexeme alone, or every word starting with its light stem."""
    stem = stem_prefix(lexeme)
    if stem is None:
        return lexeme, lexeme + "\x01"
    return stem, stem[:-1] + chr(ord(stem[-1]) + 1)


@dataclass(slots=True)
class Candidate:
    path: str
    bm25: float
    coverage: float  # matched IDF / query IDF, 0..1
    card_key: str | None = None
    incoming: int = 0
    penalised: bool = False  # superseded status or the stale decay tier


@dataclass(slots=True)
class Ranked:
    path: str
    score: float
    bm25: float = 0.0
    hop: int | None = None  # link distance from a top hit; None when unrelated
    via_link: bool = False  # surfaced only through the graph, with no term of the query


def base_score(c: Candidate) -> float:
    """BM25 weighted by IDF coverage: a hit on the rare words outranks one on common ones."""
    return c.bm25 * (COVERAGE_FLOOR + c.coverage)


def link_hops(seeds: list[str], edges: list[tuple[str, str]], max_hops: int = 2
              ) -> dict[str, tuple[int, str]]:
    """Undirected BFS: card key -> (hops, the seed it was reached from)."""
    adj: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        adj[a].add(b)
        adj[b].add(a)
    found: dict[str, tuple[int, str]] = {}
    queue: deque[tuple[str, int, str]] = deque((s, 0, s) for s in seeds)
    while queue:
        key, hop, seed = queue.popleft()
        if key in found:
            continue
        found[key] = (hop, seed)
        if hop < max_hops:
            for nxt in sorted(adj[key]):
                if nxt not in found:
                    queue.append((nxt, hop + 1, seed))
    return found


def rerank(candidates: list[Candidate], edges: list[tuple[str, str]],
           neighbours: list[Candidate] | None = None, use_graph: bool = True) -> list[Ranked]:
    """Final order: base score, the graph walk from the top 3, incoming links, penalties.

    A card reached through the graph without matching any query term (`neighbours`)
    inherits its seed's BM25 at zero coverage, so linked cards surface together but below
    the hits that matched the words.
    """
    ranked_base = sorted(candidates, key=lambda c: (-base_score(c), c.path))
    hops: dict[str, tuple[int, str]] = {}
    seed_bm25: dict[str, float] = {}
    if use_graph:
        seeds = [c for c in ranked_base if c.card_key][:GRAPH_SEEDS]
        seed_bm25 = {c.card_key: c.bm25 for c in seeds if c.card_key}
        hops = link_hops(list(seed_bm25), edges)
    out: dict[str, Ranked] = {}

    def finish(c: Candidate, score: float, hop: int | None, via_link: bool) -> None:
        score *= 1 + LINK_BOOST * math.log1p(c.incoming)
        if c.penalised:
            score *= STALE_PENALTY
        prev = out.get(c.path)
        if prev is None or score > prev.score:
            out[c.path] = Ranked(path=c.path, score=score, bm25=c.bm25,
                                                 hop=hop, via_link=via_link)

    for c in ranked_base:
        hop = hops[c.card_key][0] if c.card_key and c.card_key in hops else None
        factor = HOP_FACTORS[hop] if hop is not None else 1.0
        finish(c, base_score(c) * factor, hop, False)
    for n in neighbours or []:
        if n.path in out or not n.card_key or n.card_key not in hops:
            continue
        hop, seed = hops[n.card_key]
        if hop == 0:
            continue
        finish(n, seed_bm25[seed] * COVERAGE_FLOOR * HOP_FACTORS[hop], hop, True)
    return sorted(out.values(), key=lambda r: (-r.score, r.path))


def rrf_fuse(rankings: list[list[str]], k: int = RRF_K) -> list[str]:
    """Reciprocal rank fusion. Cut the result on rank: fused scores are tiny and flat."""
    fused: dict[str, float] = defaultdict(float)
    best: dict[str, int] = {}
    for ranking in rankings:
        for rank, path in enumerate(ranking, start=1):
            fused[path] += 1.0 / (k + rank)
            best[path] = min(best.get(path, rank), rank)
    return sorted(fused, key=lambda p: (-fused[p], best[p], p))


@dataclass(slots=True)
class DenseHit:
    """A document's best chunk in the dense search."""

    path: str
    similarity: float  # cosine, -1..1
    chunk: int
    start: int
    end: int
    heading: str = ""
    penalised: bool = False


@dataclass(slots=True)
class Fused:
    """One hit of the fused ranking with the components it was ranked by."""

    path: str
    score: float  # the fused score (reciprocal ranks, the stale penalty applied)
    lexical_rank: int | None = None  # 1-based, in the BM25 + graph order
    lexical: float | None = None  # the BM25 + graph score
    bm25: float | None = None  # the document's own BM25 (0 for one reached by a link)
    dense_rank: int | None = None
    dense: float | None = None  # cosine similarity of its best chunk
    hop: int | None = None
    via_link: bool = False
    chunk: DenseHit | None = None

    def components(self) -> dict[str, float]:
        out = {"fused": round(self.score, 6)}
        for key in ("lexical_rank", "lexical", "bm25", "dense_rank", "dense", "hop"):
            value = getattr(self, key)
            if value is not None:
                out[key] = round(float(value), 4)
        return out


def fuse(lexical: list[Ranked], dense: list[DenseHit], *, k: int = HYBRID_RRF_K,
         weights: tuple[float, float] = (LEXICAL_WEIGHT, DENSE_WEIGHT),
         floor: float = DENSE_FLOOR) -> list[Fused]:
    """Reciprocal rank fusion of the lexical and the dense ranking.

    A dense hit under `floor` counts for nothing (its similarity is still shown on a
    document the lexical ranking found): a weak nearest neighbour neither brings an
    unrelated document in nor pushes a clear lexical winner down. A penalised (superseded or
    stale) document found by the dense search alone sinks as the lexical ranking sinks it.
    """
    out: dict[str, Fused] = {}
    for rank, r in enumerate(lexical[:FUSE_DEPTH], start=1):
        out[r.path] = Fused(
            path=r.path, score=weights[0] / (k + rank), lexical_rank=rank, lexical=r.score,
            bm25=r.bm25, hop=r.hop, via_link=r.via_link)
    rank = 0
    for d in dense:
        hit = out.get(d.path)
        if d.similarity < floor:
            if hit is not None:
                hit.dense, hit.chunk = d.similarity, d
            continue
        rank += 1
        if hit is None:
            hit = out[d.path] = Fused(path=d.path, score=0.0)
        share = weights[1] / (k + rank)
        hit.score += share * (STALE_PENALTY if d.penalised and hit.lexical_rank is None
                              else 1.0)
        hit.dense_rank, hit.dense, hit.chunk = rank, d.similarity, d
    return sorted(out.values(), key=lambda f: (-f.score, _best_rank(f), f.path))


def _best_rank(f: Fused) -> int:
    """The better of a hit's two ranks (a fused hit has at least one)."""
    a, b = f.lexical_rank, f.dense_rank
    if a is None:
        return b if b is not None else 0
    return a if b is None or a <= b else b


def snippet_span(text: str, lexemes: list[str], start: int, end: int,
                 max_chars: int) -> tuple[int, int]:
    """The part of text[start:end] a hit shows: all of it when it fits, else `max_chars`
    from the line holding the first query word (its light stem for a long word)."""
    if end - start <= max_chars:
        return start, end
    lowered = text[start:end].casefold()
    first = -1
    for lex in lexemes:
        needle = stem_prefix(lex) or lex
        at = lowered.find(needle.casefold())
        if at >= 0 and (first < 0 or at < first):
            first = at
    if first <= 0:
        return start, start + max_chars
    line = lowered.rfind("\n", max(0, first - max_chars // 4), first)
    begin = start + (line + 1 if line >= 0 else max(0, first - max_chars // 8))
    return begin, min(end, begin + max_chars)


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def recall_at_k(ranked: list[str], relevant: set[str], k: int = 5) -> float:
    if not relevant:
        return 0.0
    return len(set(ranked[:k]) & relevant) / len(relevant)


def reciprocal_rank(ranked: list[str], relevant: set[str]) -> float:
    for i, path in enumerate(ranked, start=1):
        if path in relevant:
            return 1.0 / i
    return 0.0
