"""The workspace store's rules, the same for the local folder and PostgreSQL: versions,
a write applied once per op id, the newest write read, size limits, paths kept inside."""

from __future__ import annotations

import pytest

from activities.workspace import (
    SHARED_SCOPE,
    LocalStore,
    PostgresStore,
    StoreError,
    StoreLimitError,
)


@pytest.fixture(params=["local", "postgres"])
def store(request, tmp_path, database_url):
    if request.param == "local":
        return LocalStore(tmp_path / "workspaces", tmp_path, max_file_bytes=100,
                          max_workspace_bytes=250)
    return PostgresStore(database_url, max_file_bytes=100, max_workspace_bytes=250)


async def test_versions_and_a_retried_write_applied_once(store):
    assert await store.read("s1", "a.txt") is None
    assert await store.write("s1", "a.txt", b"one", op_id="tool:1") == 1
    # The same tool call again (a retried activity): not applied a second time.
    assert await store.write("s1", "a.txt", b"changed", op_id="tool:1") == 1
    assert await store.applied("s1", "tool:1") == 1 and await store.applied("s1", "x") is None
    assert (await store.read("s1", "a.txt")).data == b"one"
    assert await store.write("s1", "./dir/../a.txt", b"two", op_id="tool:2") == 2
    assert await store.write("s1", "a.txt", b"three") == 3  # no op id: applied every time
    assert await store.write("s1", "a.txt", b"three") == 4
    found = await store.read("s1", "a.txt")
    assert (found.data, found.version) == (b"three", 4)
    assert await store.read("s2", "a.txt") is None  # scopes are apart
    assert [(f.path, f.size, f.version) for f in await store.list("s1")] == [("a.txt", 5, 4)]


async def test_limits_refuse_and_write_nothing(store):
    with pytest.raises(StoreLimitError, match=r"'big\.bin' would be 101 bytes; the limit is 100"):
        await store.write("s1", "big.bin", b"x" * 101)
    await store.write("s1", "a", b"x" * 100)
    await store.write("s1", "b", b"x" * 100)
    with pytest.raises(StoreLimitError, match="the workspace would be 260 bytes; the limit "
                                              "is 250"):
        await store.write("s1", "c", b"x" * 60)
    await store.write("s1", "a", b"x" * 50)  # replacing a file counts its new size only
    assert [f.path for f in await store.list("s1")] == ["a", "b"]


async def test_paths_stay_inside_and_shared_skills_list_by_prefix(store):
    for bad in ("../x", "/etc/passwd", "", "a\x00b", "."):
        with pytest.raises(StoreError):
            await store.write("s1", bad, b"x")
    with pytest.raises(StoreError):
        await store.read("../other", "a")
    await store.write(SHARED_SCOPE, "skills/house/SKILL.md", b"---\nname: house\n---\n")
    assert [f.path for f in await store.list(SHARED_SCOPE, "skills/")] == [
        "skills/house/SKILL.md"]


async def test_prompt_files_read_at_once_what_the_separate_reads_give(store):
    """One read for a model call's prompt: the AGENTS.md files (root and indexed nested
    ones), the shared paths asked for, every shared skill's SKILL.md; nothing else."""
    await store.write("s1", "AGENTS.md", b"root")
    await store.write("s1", "sub/AGENTS.md", b"nested")
    await store.write("s1", "notes.md", b"not a prompt file")
    await store.write("s2", "AGENTS.md", b"another session")
    await store.write(SHARED_SCOPE, "skills/house/SKILL.md", b"---\nname: house\n---\n")
    await store.write(SHARED_SCOPE, "skills/house/extra.md", b"an attachment")
    await store.write(SHARED_SCOPE, "skills/a/b/SKILL.md", b"too deep")
    await store.write(SHARED_SCOPE, "vault-copies/alice/CORE.md", b"core")
    await store.write(SHARED_SCOPE, "vault-copies/bob/CORE.md", b"not asked")
    asked = ["vault-copies/alice/CORE.md", "vault-copies/alice/schema.json"]
    files = await store.prompt_files("s1", asked)
    assert files.agents == await store.agents_files("s1") == {
        "AGENTS.md": b"root", "sub/AGENTS.md": b"nested"}
    assert files.shared == {"vault-copies/alice/CORE.md": b"core",
                            "skills/house/SKILL.md": b"---\nname: house\n---\n"}
    assert files.asked == frozenset(asked)
    assert (await store.prompt_files("nobody", [])).agents == {}
    bare = await store.prompt_files("s1", asked, skills=False)
    assert bare.agents == files.agents and bare.shared == {"vault-copies/alice/CORE.md": b"core"}
