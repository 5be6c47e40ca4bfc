"""Pure rules of schemas.vault.graph: the link graph, health, decay and the scans."""

from pathlib import Path

import pytest

from schemas.vault.graph import (
    GraphNode,
    build_graph,
    decay,
    dedup_scan,
    health,
    link_cleanup_scan,
    supersede_scan,
)
from schemas.vault.schema import parse_schema

TEMPLATE = Path(__file__).resolve().parents[2] / "keel" / "vault_template"


@pytest.fixture(scope="module")
def schema():
    s, problems = parse_schema((TEMPLATE / "schema.json").read_text())
    assert problems == []
    return s


def node(path, links=(), card=True, desc="d", **kw):
    stem = path.rsplit("/", 1)[-1][:-3]
    return GraphNode(path=path, key=stem.casefold(), title=stem, is_card=card,
                     links=list(links), description=desc, **kw)


def test_graph_health_formula():
    nodes = [node("cards/a/A.md", ["B", "Missing"]), node("cards/a/B.md", ["A"]),
             node("cards/a/C.md", desc=""), node("daily/2026-01-01.md", ["A"], card=False)]
    g = build_graph(nodes)
    assert ("cards/a/A.md", "cards/a/B.md") in g.edges
    assert g.broken == [("cards/a/A.md", "Missing")]
    h = health(g)
    # orphans 1/3, broken 1/3 of card links, avg links 2/3, descriptions 2/3
    expected = 100 - 30 / 3 - 30 / 3 - 15 * (3 - 2 / 3) - 10 / 3
    assert h.score == round(expected, 1) and h.orphans == 1 and h.broken_links == 1


def test_links_by_path_and_cards_win_bare_names():
    nodes = [node("daily/2026-01-01.md", card=False), node("summaries/daily/2026-01-01.md",
             ["daily/2026-01-01"], card=False), node("cards/a/X.md", ["2026-01-01"])]
    g = build_graph(nodes)
    assert ("summaries/daily/2026-01-01.md", "daily/2026-01-01.md") in g.edges


def test_decay_formula_and_tiers(schema):
    rel, tier = decay(schema.decay, "note", access_count=1, days_idle=10)
    assert rel == round(1 - 0.02 * 10, 3) and tier == "warm"
    rel, tier = decay(schema.decay, "note", access_count=20, days_idle=100)
    assert rel == max(0.1, round(1 - 0.02 / (1 + __import__("math").log(20)) * 100, 3))
    assert tier == "cold"
    assert decay(schema.decay, "note", 0, 400, is_core=True)[1] == "hot"
    assert decay(schema.decay, "idea", 0, 1000)[0] == 0.1


def test_scans_find_duplicates_conflicts_and_broken_links():
    nodes = [node("cards/c/Anna Petrova.md", ["Ana Petrova"], card_type="contact"),
             node("cards/c/Anna Petrova (TDI).md", card_type="contact"),
             node("cards/c/Bob.md", card_type="contact")]
    g = build_graph(nodes)
    assert len(dedup_scan(g, {})) == 1
    assert link_cleanup_scan(g)[0].suggestion == "[[Anna Petrova]]"
    found = supersede_scan({"cards/c/Bob.md": [("city", "Berlin"), ("City", "Munich")]})
    assert found and "city" in found[0].detail
