"""What an erasure says (schemas.vault.erase), without a server: nothing found is said as
such, never as an erasure; a refusal names at most five sessions and how to go on."""

from __future__ import annotations

from schemas.vault.erase import ScopeErased, erased_text, running_text


def test_nothing_found_is_never_said_as_erased() -> None:
    done = ScopeErased(scope="acme")
    assert not done.found
    assert erased_text(done) == ("no long memory of scope 'acme' here (keel vault list names "
                                 "the scopes); nothing was erased")


def test_what_went_is_said_by_table_and_folder() -> None:
    done = ScopeErased(scope="acme", folder="/v/acme", files=12,
                       rows={"vault_ops": 2, "memory_docs": 40},
                       sessions_deleted=["a", "b"])
    assert done.found
    assert erased_text(done) == (
        "erased memory scope 'acme': 2 session(s) deleted first; its vault folder /v/acme "
        "(12 file(s), with its git history); 42 row(s) of its index and queues "
        "(memory_docs 40, vault_ops 2)")
    rows_only = ScopeErased(scope="acme", rows={"transcript_outbox": 1})
    assert rows_only.found and "no vault folder; 1 row(s)" in erased_text(rows_only)


def test_a_refusal_names_five_sessions_and_counts_the_rest() -> None:
    said = running_text("acme", [f"s{i}" for i in range(7)])
    assert "in use by 7 running session(s) (s0, s1, s2, s3, s4 and 2 more)" in said
    assert said.endswith("(--with-sessions --force) to stop and delete them; nothing was "
                         "erased")
