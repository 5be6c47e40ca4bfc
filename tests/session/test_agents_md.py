"""Which AGENTS.md files the system prompt carries, in both workspace stores: the root's and
every one written through the store (its index), none under `.keel/`, and the prompt is
built from point reads, so a file the store never wrote below the root is not found by a
listing (the rule of activities.workspace)."""

from __future__ import annotations

import pytest

from activities.context import SessionContext
from activities.workspace import AGENTS_INDEX, LocalStore, PostgresStore, WorkspaceStore
from tests.harness import make_settings
from workers.worker import model_backends


@pytest.fixture(params=["local", "postgres"])
def store(request, database_url, tmp_path) -> WorkspaceStore:
    if request.param == "local":
        return LocalStore(tmp_path / "workspaces", tmp_path, 1 << 20, 1 << 24)
    return PostgresStore(database_url, 1 << 20, 1 << 24)


async def test_root_and_written_agents_files_are_found_by_point_reads(store, tmp_path):
    await store.write("s1", "AGENTS.md", b"root rules")
    await store.write("s1", "svc/billing/AGENTS.md", b"billing rules")
    await store.write("s1", "svc/billing/AGENTS.md", b"billing rules, v2")  # indexed once
    await store.write("s1", ".keel/AGENTS.md", b"never shown")
    await store.write("s1", "docs/NOT_AGENTS.md", b"not a rules file")
    await store.write("s2", "other/AGENTS.md", b"another session's")
    found = await store.agents_files("s1")
    assert found == {"AGENTS.md": b"root rules", "svc/billing/AGENTS.md": b"billing rules, v2"}
    index = await store.read("s1", AGENTS_INDEX)
    assert index is not None and index.data == b'["svc/billing/AGENTS.md"]'
    assert await store.agents_files("empty") == {}


async def test_the_system_prompt_carries_them_in_path_order(store, database_url, tmp_path):
    ctx = SessionContext(make_settings(database_url, tmp_path), model=model_backends(),
                         store=store)
    await store.write("s1", "z/AGENTS.md", b"rules of z")
    await store.write("s1", "AGENTS.md", b"rules of the root")
    prompt = await ctx.prompt.system_prompt("s1")
    assert "rules of the root" in prompt and "rules of z" in prompt
    assert prompt.index("rules of the root") < prompt.index("rules of z")


async def test_a_local_file_the_store_never_wrote_counts_only_at_the_root(tmp_path):
    store = LocalStore(tmp_path / "workspaces", tmp_path, 1 << 20, 1 << 24)
    folder = store.folder("s1")
    (folder / "deep").mkdir(parents=True)
    (folder / "deep" / "AGENTS.md").write_bytes(b"put by hand below the root")
    (folder / "AGENTS.md").write_bytes(b"put by hand at the root")
    assert await store.agents_files("s1") == {"AGENTS.md": b"put by hand at the root"}
