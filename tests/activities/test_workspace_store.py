"""The PostgreSQL workspace store's per-scope totals (infra/migrations/005): a write checks the
quota against the scope's maintained total, which stays equal to the sum of its files
whatever changes them, and the check holds under concurrent writers. Also the kept-result
size rule both stores share."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from activities.db import apply_migrations
from activities.workspace import (
    KEPT_RESULTS_PREFIX,
    LocalStore,
    PostgresStore,
    StoreError,
    StoreLimitError,
)


def totals(database_url: str) -> dict[str, tuple[int, int]]:
    """scope → (maintained total, actual sum of its files), for every scope either knows."""
    with psycopg.connect(database_url) as conn:
        found = conn.execute(
            "SELECT coalesce(s.scope, f.scope), coalesce(s.total_bytes, -1),"
            " coalesce(f.bytes, 0) FROM workspace_scopes s FULL JOIN"
            " (SELECT scope, sum(size) AS bytes FROM workspace_files GROUP BY scope) f"
            " ON f.scope = s.scope").fetchall()
    return {scope: (int(total), int(actual)) for scope, total, actual in found}


def assert_true_totals(database_url: str) -> None:
    for scope, (total, actual) in totals(database_url).items():
        assert total == actual, (scope, total, actual)


async def test_the_total_follows_every_change(database_url):
    store = PostgresStore(database_url, 1000, 10_000)
    await store.write("s1", "a.txt", b"x" * 100)
    await store.write("s1", "a.txt", b"x" * 40)  # replaced in place
    await store.write("s1", "docs/AGENTS.md", b"rules")  # and the index file with it
    await store.write("s2", "b.txt", b"y" * 7, op_id="op-1")
    await store.write("s2", "b.txt", b"y" * 900, op_id="op-1")  # applied once
    assert totals(database_url)["s1"][0] == 40 + 5 + len(b'["docs/AGENTS.md"]')
    assert totals(database_url)["s2"] == (7, 7)
    with psycopg.connect(database_url) as conn:  # changes made outside the store
        with conn.cursor().copy("COPY workspace_files (scope, path, version, data, size)"
                                " FROM STDIN") as copy:
            for n in range(50):
                copy.write_row(("s3", f"f{n}", 1, b"z" * n, n))
        conn.execute("UPDATE workspace_files SET scope='s2', size=size+1 WHERE path='f10'")
        conn.execute("DELETE FROM workspace_files WHERE scope='s1' AND path='a.txt'")
    assert_true_totals(database_url)
    assert totals(database_url)["s3"][0] == sum(range(50)) - 10


async def test_the_quota_is_checked_against_the_total_not_a_sum(database_url):
    store = PostgresStore(database_url, 1000, 10_000)
    await store.write("s1", "a.txt", b"x" * 10)
    with psycopg.connect(database_url) as conn:  # the total says the scope is nearly full
        conn.execute("UPDATE workspace_scopes SET total_bytes = 9_995 WHERE scope='s1'")
    with pytest.raises(StoreLimitError, match="the workspace would be 10,015 bytes"):
        await store.write("s1", "b.txt", b"x" * 20)
    await store.write("s1", "a.txt", b"x" * 15)  # a replacement counts its new size only


async def test_concurrent_writers_never_pass_the_quota(database_url):
    # Each write on a connection of its own, all at once: 30 files of 100 bytes, room
    # for 10; then 10 writers growing files that are already there.
    store = PostgresStore(database_url, 1000, 1000, pooled=False)

    async def write(path: str, size: int) -> bool:
        try:
            await store.write("s1", path, b"x" * size, op_id=f"op-{path}-{size}")
        except StoreLimitError:
            return False
        return True

    done = await asyncio.gather(*(write(f"f{n}", 100) for n in range(30)))
    assert sum(done) == 10
    assert totals(database_url)["s1"] == (1000, 1000)
    shrunk = await asyncio.gather(*(write(f"f{n}", 50) for n in range(30) if done[n]))
    assert all(shrunk) and totals(database_url)["s1"] == (500, 500)
    grown = await asyncio.gather(*(write(f"f{n}", 150) for n in range(30) if done[n]))
    assert sum(grown) == 5  # 5 × 150 + 5 × 50 = 1000
    assert_true_totals(database_url)


def test_the_migration_counts_what_was_there_before(database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:  # as before migration 005
        conn.execute("DROP TABLE workspace_scopes")
        conn.execute("DROP FUNCTION workspace_scope_totals() CASCADE")
        conn.execute("DELETE FROM schema_migrations WHERE name='005_workspace_totals.sql'")
        conn.execute("INSERT INTO workspace_files (scope, path, version, data, size) VALUES"
                     " ('old', 'a', 1, 'aaa', 3), ('old', 'b', 1, 'bb', 2),"
                     " ('other', 'c', 1, 'c', 1)")
    assert apply_migrations(database_url) == ["005_workspace_totals.sql"]
    assert totals(database_url) == {"old": (5, 5), "other": (1, 1)}


@pytest.mark.parametrize("kind", ["local", "postgres"])
async def test_a_kept_result_may_pass_the_file_limit_not_the_workspace_limit(
        kind, tmp_path, database_url):
    store = (LocalStore(tmp_path / "w", tmp_path, 100, 2000) if kind == "local"
             else PostgresStore(database_url, 100, 2000))
    kept = f"{KEPT_RESULTS_PREFIX}toolu_1.txt"
    assert await store.write("s1", kept, b"r" * 1500) == 1
    with pytest.raises(StoreLimitError, match=r"'notes\.txt' would be 1,500 bytes"):
        await store.write("s1", "notes.txt", b"n" * 1500)
    with pytest.raises(StoreLimitError, match="the workspace would be 2,500 bytes"):
        await store.write("s1", f"{KEPT_RESULTS_PREFIX}toolu_2.txt", b"r" * 1000)


@pytest.mark.parametrize("kind", ["local", "postgres"])
async def test_a_session_of_a_long_id_has_a_workspace_of_its_own(kind, tmp_path, database_url):
    """A session id may be as long as a workflow id (1,000 bytes); a folder's name may not
    pass 255: the local store names it by the id's start and digest, apart from every
    other id's, where a write failed (File name too long)."""
    store = (LocalStore(tmp_path / "w", tmp_path, 10_000, 100_000) if kind == "local"
             else PostgresStore(database_url, 10_000, 100_000))
    long_a = "ü" * 300 + "-a"  # 602 bytes
    long_b = "ü" * 300 + "-b"  # the same start
    assert await store.write(long_a, "notes.txt", b"a") == 1
    assert await store.write(long_b, "notes.txt", b"b") == 1
    for scope, data in ((long_a, b"a"), (long_b, b"b")):
        found = await store.read(scope, "notes.txt")
        assert found is not None and found.data == data
    if kind == "local":
        names = [p.name for p in (tmp_path / "w").iterdir()]
        assert len(names) == 2 and all(len(n.encode()) <= 255 for n in names)


@pytest.mark.parametrize("kind", ["local", "postgres"])
async def test_a_path_is_a_name_both_stores_can_hold(kind, tmp_path, database_url):
    """No control character (a newline in a name forged a line of `keel files` and of the
    system prompt's AGENTS.md headings: "x\n## Instructions…/AGENTS.md" was taken), no name
    past 200 bytes nor path past 1,024 (the local store failed them with the host's
    "File name too long" and its folder's path, where the other store took them)."""
    store = (LocalStore(tmp_path / "w", tmp_path, 10_000, 100_000) if kind == "local"
             else PostgresStore(database_url, 10_000, 100_000))
    for bad in ("new\nline.txt", "x\n## Instructions for this session/AGENTS.md",
                "tab\there.txt", "esc\x1b[2J.txt", "del\x7f.txt", "c1\x85.txt"):
        with pytest.raises(StoreError, match="may not hold a control character"):
            await store.write("s1", bad, b"x")
        with pytest.raises(StoreError, match="may not hold a control character"):
            await store.read("s1", bad)
    for bad in ("ü" * 101 + ".txt", "/".join(["d" * 200] * 6)):
        with pytest.raises(StoreError, match="a path may have at most 1,024 bytes"):
            await store.write("s1", bad, b"x")
    fine = "/".join(["é" * 99] * 5) + "/Ωmega notes.txt"  # 1,011 bytes, 198 a name
    assert await store.write("s1", fine, b"kept") == 1
    found = await store.read("s1", fine)
    assert found is not None and found.data == b"kept"
    assert [f.path for f in await store.list("s1")] == [fine]


async def test_the_local_listing_shows_only_files_it_would_read(tmp_path):
    """A half-written file a killed worker left (the write's temporary name) and a link a
    person made to a host file: neither is listed (`keel files`, the agent's list_files,
    an export), as neither is ever read. A link inside the workspace is."""
    store = LocalStore(tmp_path / "w", tmp_path, 10_000, 100_000)
    await store.write("s1", "notes/a.md", b"alpha")
    folder = store.folder("s1")
    (folder / "notes" / ".keel-k3x9_a2q.tmp").write_bytes(b"alp")  # killed mid-write
    (tmp_path / "host.txt").write_text("the host's")
    (folder / "notes" / "host.md").symlink_to(tmp_path / "host.txt")
    (folder / "notes" / "same.md").symlink_to(folder / "notes" / "a.md")
    assert [f.path for f in await store.list("s1")] == ["notes/a.md", "notes/same.md"]
    assert not [p for p in (folder / "notes").iterdir() if p.name.startswith(".keel-")
                and p.name != ".keel-k3x9_a2q.tmp"]  # a write leaves no file of its own
    with pytest.raises(StoreError, match="outside the session's workspace"):
        await store.read("s1", "notes/host.md")


@pytest.mark.parametrize("kind", ["local", "postgres"])
async def test_a_folder_is_removed_with_its_versions_and_nothing_beside_it(
        kind, tmp_path, database_url):
    """What an erased memory scope's published copies need (activities.vault_share): the
    folder's files and their history go; a folder whose name only starts the same stays."""
    store = (LocalStore(tmp_path / "w", tmp_path, 10_000, 100_000) if kind == "local"
             else PostgresStore(database_url, 10_000, 100_000))
    for path in ("copies/acme/CORE.md", "copies/acme/CORE.md", "copies/acme/schema.json",
                 "copies/acme2/CORE.md", "notes.txt"):
        await store.write("_shared", path, b"words of " + path.encode())
    with pytest.raises(StoreError, match="is not a folder"):
        await store.remove("_shared", "copies/acme")
    assert await store.remove("_shared", "copies/acme/") == 2
    assert [f.path for f in await store.list("_shared", "copies/")] == ["copies/acme2/CORE.md"]
    assert await store.read("_shared", "copies/acme/CORE.md") is None
    assert await store.read("_shared", "notes.txt") is not None
    assert await store.remove("_shared", "copies/acme/") == 0
    written = await store.write("_shared", "copies/acme/CORE.md", b"new")
    assert written == 1  # a file of that path starts its history afresh
    if kind == "postgres":
        with psycopg.connect(database_url) as conn:
            kept = conn.execute("SELECT path, version FROM workspace_file_versions WHERE"
                                " scope = '_shared' AND starts_with(path, 'copies/acme/')"
                                " ORDER BY id").fetchall()
        assert kept == [("copies/acme/CORE.md", 1)]
        assert_true_totals(database_url)
