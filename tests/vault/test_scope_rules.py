"""Pure rules of schemas.vault.scope: scope ids, the fixed scope, memory tool inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.session import SessionConfig
from schemas.vault.card import CardFact
from schemas.vault.scope import ScopeError, check_scope, scope_changed, tool_scope_problem
from schemas.vault.settings import MemorySettings

CARD_FIELDS = set(CardFact.model_fields)
SEARCH_FIELDS = {"query", "limit"}


@pytest.mark.parametrize("scope", ["default", "alice", "team-7", "acme.eu_1", "a" * 64])
def test_scope_ids_that_name_a_folder(scope):
    assert check_scope(scope) == scope


@pytest.mark.parametrize("scope", ["", ".", "..", "../x", "a/b", "Alice", "-x", ".hidden",
                                   "a" * 65, "x y", "x\x00", "é"])
def test_scope_ids_that_could_not(scope):
    with pytest.raises(ScopeError):
        check_scope(scope)
    with pytest.raises(ValidationError):
        SessionConfig(memory_scope=scope)


def test_session_config_default_and_none():
    assert SessionConfig().memory_scope == "default"
    assert SessionConfig(memory_scope=None).memory_scope is None


def test_vault_folders_per_scope(tmp_path: Path):
    memory = MemorySettings(vault_dir=tmp_path / "vault")
    # The existing single vault is the default scope's: nothing moves.
    assert memory.vault_dir_for("default") == tmp_path / "vault"
    assert memory.vault_dir_for("alice") == tmp_path / "vaults" / "alice"
    other = MemorySettings(vault_dir=tmp_path / "vault", vaults_dir=tmp_path / "elsewhere")
    assert other.vault_dir_for("bob") == tmp_path / "elsewhere" / "bob"
    with pytest.raises(ScopeError):
        memory.vault_dir_for("../vault")


def test_a_scope_is_fixed():
    assert scope_changed("alice", "alice") is None
    assert scope_changed(None, None) is None
    assert "refused" in (scope_changed("alice", "bob") or "")
    assert scope_changed("alice", None) and scope_changed(None, "alice")


@pytest.mark.parametrize("args", [
    {"query": "kettle order"}, {"query": "Anna Petrova employer", "limit": 3},
    {"query": "and/or both: yes"}, {"query": "бухгалтер отчёт"},
])
def test_search_inputs_that_are_words(args):
    assert tool_scope_problem("memory_search", args, SEARCH_FIELDS) is None


@pytest.mark.parametrize("args", [
    {"query": "kettle", "scope": "bob"}, {"query": "kettle", "path": "cards/x.md"},
    {"query": "kettle", "vault": "bob"}, {"query": "kettle", "id": "bob:1"},
    {"query": "cards/contacts/Anna.md"}, {"query": "bob:cards/notes/Kettle order.md"},
    {"query": "../bob/CORE.md"}, {"query": "see vaults/bob/daily"},
    {"query": "/srv/keel/vaults/bob/CORE.md"}, {"query": "daily/2026-06-01.md#s:3"},
])
def test_search_inputs_naming_a_place_are_refused(args):
    problem = tool_scope_problem("memory_search", args, SEARCH_FIELDS)
    assert problem and "refused" in problem


def test_write_card_inputs():
    ok = {"op": "ADD", "type": "note", "title": "Kettle order", "value": "ships Tuesday",
          "links": ["Anna Petrova"]}
    assert tool_scope_problem("write_card", ok, CARD_FIELDS) is None
    for bad in ({**ok, "scope": "bob"}, {**ok, "title": "../bob/cards/notes/Kettle order"},
                {**ok, "links": ["bob:cards/contacts/Anna"]}, {**ok, "card_path": "x.md"},
                {**ok, "title": "cards/notes/Kettle order"}):
        assert "refused" in (tool_scope_problem("write_card", bad, CARD_FIELDS) or ""), bad


@pytest.mark.parametrize("path", [
    "cards/contacts/Anna Petrova.md", "daily/2026-06-01.md#session-1:3", "daily/2026-06-01.md",
    "summaries/weekly/2026-W22.md", "CORE.md", "cards/notes/a..b.md"])
def test_memory_get_takes_a_path_of_the_sessions_own_memory(path):
    assert tool_scope_problem("memory_get", {"path": path}, {"path"}) is None


@pytest.mark.parametrize("args", [
    {"path": "bob:cards/notes/Kettle order.md"}, {"path": "../bob/CORE.md"},
    {"path": "cards/../../bob/CORE.md"}, {"path": "/srv/keel/vaults/bob/CORE.md"},
    {"path": "~/vault/CORE.md"}, {"path": "C:\\vault\\CORE.md"}, {"path": "..\\CORE.md"},
    {"path": "CORE.md", "scope": "bob"}, {"path": "CORE.md", "query": "x"}])
def test_memory_get_refuses_a_path_of_another_place(args):
    problem = tool_scope_problem("memory_get", args, {"path"})
    assert problem and "refused" in problem
