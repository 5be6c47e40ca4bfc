"""Pure rules of the vault: frontmatter, cards, ADD / SUPERSEDE / NOOP, schema, graph."""

import json
from datetime import date
from pathlib import Path

import pytest

from schemas.vault import CardOp, Confidence, parse_schema
from schemas.vault_card import (
    CardFact,
    FrontmatterError,
    apply_fact,
    canonical_meta,
    card_filename,
    parse_card,
    render_frontmatter,
    split_frontmatter,
    wikilinks,
)
from schemas.vault_graph import (
    GraphNode,
    build_graph,
    decay,
    dedup_scan,
    health,
    link_cleanup_scan,
    supersede_scan,
)
from schemas.vault_rollup import (
    CoreDoc,
    CoreUpdate,
    RollupKind,
    due_periods,
    merge_core,
    parse_core,
    render_core,
    request_kind,
    split_transcript,
    transcript_entry,
)

TEMPLATE = Path(__file__).resolve().parent.parent / "keel" / "vault_template"


@pytest.fixture(scope="module")
def schema():
    s, problems = parse_schema((TEMPLATE / "schema.json").read_text())
    assert problems == []
    return s


def test_frontmatter_round_trip_keeps_values():
    meta = {"id": "x", "title": "Anna: the boss", "tags": ["a", "b,c"], "n": 3, "f": 0.5,
            "yes": True, "empty": None, "date": "2026-06-01", "word": "true"}
    back, body = split_frontmatter(render_frontmatter(meta) + "# Body\n")
    assert back == meta
    assert body == "# Body\n"


@pytest.mark.parametrize("text,line", [
    ("---\ntitle: x\n", 1),
    ("---\ntitle: x\nthis is not yaml\n---\n", 3),
    ("---\ntitle: \"unclosed\n---\n", 2),
    ("---\ntitle: x\ntitle: y\n---\n", 3),
])
def test_broken_frontmatter_is_reported_with_its_line(text, line):
    with pytest.raises(FrontmatterError) as err:
        split_frontmatter(text)
    assert err.value.line == line


def test_block_lists_and_wikilinks():
    meta, _ = split_frontmatter("---\ntags:\n  - one\n  - two\n---\n")
    assert meta == {"tags": ["one", "two"]}
    assert wikilinks("see [[Anna Petrova|Anna]] and [[Project#Goals]], not [x]") == [
        "Anna Petrova", "Project"]
    assert card_filename('a/b: "c"?') == "a b c.md"


def fact(**kw):
    base = {"op": "ADD", "type": "contact", "title": "Anna Petrova", "value": "x",
            "confidence": "EXTRACTED"}
    return CardFact.model_validate({**base, **kw})


def test_add_creates_a_card_and_is_idempotent(schema):
    first = apply_fact(None, fact(field="employer", value="Acme Corp", links=["Acme Corp"]),
                       schema, "2026-03-01")
    assert first.op == CardOp.ADD and first.text
    card = parse_card(first.text)
    assert card.meta["type"] == "contact" and card.meta["status"] == "active"
    assert "- **employer**: Acme Corp (EXTRACTED, 2026-03-01)" in first.text
    assert "[[Acme Corp]]" in first.text
    again = apply_fact(card, fact(field="employer", value="acme corp."), schema, "2026-03-02")
    assert again.op == CardOp.NOOP and again.text is None


def test_supersede_moves_old_value_to_dated_history(schema):
    card = parse_card(apply_fact(None, fact(field="employer", value="Acme Corp"), schema,
                                 "2026-03-01").text)
    out = apply_fact(card, fact(op="SUPERSEDE", field="employer", value="TDI Group"), schema,
                     "2026-06-02")
    assert out.op == CardOp.SUPERSEDE and out.old_value == "Acme Corp"
    new = parse_card(out.text)
    assert [f.value for _, f in new.facts()] == ["TDI Group"]
    assert new.section("## History") == [
        "- 2026-03-01→2026-06-02: employer: Acme Corp (EXTRACTED)"]
    # The same supersede again changes nothing, and History is never rewritten.
    assert apply_fact(new, fact(op="SUPERSEDE", field="employer", value="TDI Group"),
                      schema, "2026-06-03").op == CardOp.NOOP
    third = parse_card(apply_fact(new, fact(field="employer", value="Globex"), schema,
                                  "2026-07-01").text)
    assert len(third.section("## History")) == 2


def test_add_on_a_known_field_supersedes_and_inferred_never_beats_extracted(schema):
    card = parse_card(apply_fact(None, fact(field="city", value="Berlin"), schema,
                                 "2026-03-01").text)
    guess = apply_fact(card, fact(field="city", value="Munich", confidence="INFERRED"),
                       schema, "2026-03-02")
    assert guess.op == CardOp.NOOP and "EXTRACTED" in guess.note
    said = apply_fact(card, fact(field="city", value="Munich"), schema, "2026-03-02")
    assert said.op == CardOp.SUPERSEDE


def test_noop_and_unknown_type_write_nothing(schema):
    assert apply_fact(None, fact(op="NOOP"), schema, "2026-01-01").text is None
    out = apply_fact(None, fact(type="recipe"), schema, "2026-01-01")
    assert out.text is None and "unknown card type" in out.note
    alias = apply_fact(None, fact(type="person", value="likes tea", confidence="INFERRED"),
                       schema, "2026-01-01")
    assert parse_card(alias.text).meta["type"] == "contact"
    assert "(INFERRED, 2026-01-01)" in alias.text


def test_status_change_is_a_supersede_with_history(schema):
    card = parse_card(apply_fact(None, fact(type="project", title="Atlas", value="billing"),
                                 schema, "2026-01-01").text)
    out = apply_fact(card, fact(type="project", title="Atlas", value="", status="done"),
                     schema, "2026-02-01")
    assert out.op == CardOp.SUPERSEDE
    new = parse_card(out.text)
    assert new.meta["status"] == "done"
    assert new.section("## History") == ["- 2026-01-01→2026-02-01: status: active"]


def test_canonical_meta_coerces_fixes_and_backfills(schema):
    meta = {"type": "Person", "status": "ACTIVE", "domain": "Work", "tags": "a, #b",
            "custom": 1}
    out, fixes, problem = canonical_meta(meta, schema, stem="Anna", today="2026-06-01")
    assert problem is None
    assert out["type"] == "contact" and out["status"] == "active" and out["domain"] == "work"
    assert out["tags"] == ["a", "b"] and out["created"] == "2026-06-01"
    assert out["id"] == "Anna" and out["custom"] == 1
    assert list(out)[:4] == ["id", "type", "title", "status"]
    assert {f.field for f in fixes} >= {"type", "status", "tags", "created"}
    bad, _, problem = canonical_meta({"type": "status"}, schema, stem="x", today="2026-06-01")
    assert problem and bad == {"type": "status"}
    # An invalid status for the type falls back to the type's default.
    out, _, _ = canonical_meta({"type": "decision", "status": "active"}, schema, stem="d",
                               today="2026-06-01")
    assert out["status"] == "decided"
    # No type, but the folder tells it.
    out, _, _ = canonical_meta({}, schema, stem="d", today="2026-06-01", folder_type="idea")
    assert out["type"] == "idea"


def test_schema_with_unknown_type_is_rejected_with_every_problem():
    raw = json.loads((TEMPLATE / "schema.json").read_text())
    raw["decay"]["rates"]["recipe"] = 0.1
    raw["types"]["note"]["default_status"] = "open"
    raw["types"]["idea"]["aliases"].append("note")
    schema, problems = parse_schema(json.dumps(raw))
    assert schema is None
    wheres = {p.where for p in problems}
    assert {"decay.rates.recipe", "types.note.default_status"} <= wheres
    assert any(w.endswith(".aliases") for w in wheres)  # "note" names two types
    assert parse_schema("{not json")[0] is None


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


def test_core_merge_caps_goals_dates_lessons_and_fits():
    doc = parse_core(render_core(CoreDoc(facts=["f1"], goals=["g1"], lessons=[
        "2026-01-01: old lesson"])))
    assert doc.facts == ["f1"] and doc.lessons == ["2026-01-01: old lesson"]
    new, dropped = merge_core(doc, CoreUpdate(goals=["a", "b", "c", "d"],
                                              lessons=["check the date"]), "2026-06-01")
    assert new.goals == ["a", "b", "c"] and "goal: d" in dropped
    assert new.lessons[-1] == "2026-06-01: check the date"
    again, _ = merge_core(new, CoreUpdate(lessons=["check the date"]), "2026-06-02")
    assert again.lessons == new.lessons
    big, dropped = merge_core(doc, CoreUpdate(facts=["x" * 300] * 5, lessons=["l" * 100]),
                              "2026-06-01", cap=1200)
    assert len(render_core(big)) <= 1200 and dropped


def test_transcript_entries_are_found_by_marker_only_at_headings():
    from datetime import datetime
    text = "# 2026-06-01\n" + transcript_entry("s1", 1, datetime(2026, 6, 1, 9), "user",
                                               "quote: <!-- keel:s1:7 --> inside")
    text += transcript_entry("s1", 2, datetime(2026, 6, 1, 9, 1), "assistant", "ok")
    assert [(s, q) for s, q, _ in split_transcript(text)] == [("s1", 1), ("s1", 2)]


def test_due_periods_and_request_marker():
    sunday = date(2026, 6, 7)
    assert due_periods(RollupKind.DAILY, sunday)[0].key == "2026-06-06"
    week = due_periods(RollupKind.WEEKLY, sunday)[0]
    assert (week.start, week.end) == (date(2026, 5, 31), date(2026, 6, 6))
    assert due_periods(RollupKind.MONTHLY, date(2026, 1, 1))[0].key == "2025-12"
    assert due_periods(RollupKind.YEARLY, date(2026, 1, 1))[0].key == "2025"
    req = {"system": [{"type": "text", "text": '<keel:rollup kind="weekly" period="x">'}]}
    assert request_kind(req) == (RollupKind.WEEKLY, "x")
    assert request_kind({"system": "hello"}) is None
    assert Confidence("INFERRED")
