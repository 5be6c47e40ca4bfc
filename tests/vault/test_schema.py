"""Pure rules of schemas.vault.schema: a schema.json is accepted whole or not at all."""

import json
from pathlib import Path

import pytest

from schemas.vault.schema import parse_schema

TEMPLATE = Path(__file__).resolve().parents[2] / "keel" / "vault_template"


@pytest.fixture(scope="module")
def schema():
    s, problems = parse_schema((TEMPLATE / "schema.json").read_text())
    assert problems == []
    return s


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
