"""Pure rules of schemas.vault.card: frontmatter, cards, ADD / SUPERSEDE / NOOP."""

from pathlib import Path

import pytest

from schemas.vault.card import (
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
from schemas.vault.schema import CardOp, parse_schema

TEMPLATE = Path(__file__).resolve().parents[2] / "keel" / "vault_template"


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
