"""An upload's staged parts (schemas.uploads.STAGING) are not the session's files: the
workspace's history keeps none of them (infra/migrations/016), a fork's copy and an export's
snapshot leave them out, and a rewind leaves them where they are for the put to come."""

from __future__ import annotations

from datetime import datetime

import psycopg
import pytest

from activities.branch import _copy_workspace, _restore_workspace
from activities.db import MIGRATIONS_DIR
from activities.workspace import LocalStore, PostgresStore
from schemas.uploads import part_path

UPLOAD = "0123456789abcdef0123456789abcdef"


def history(database_url: str, scope: str) -> list[tuple[str, int, bool]]:
    with psycopg.connect(database_url) as conn:
        return [(p, v, d) for p, v, d in conn.execute(
            "SELECT path, version, data IS NULL FROM workspace_file_versions"
            " WHERE scope = %s ORDER BY id", (scope,)).fetchall()]


async def test_parts_leave_no_history_and_a_fork_or_rewind_leaves_them_alone(database_url):
    store = PostgresStore(database_url, 1_000_000, 10_000_000)
    await store.write("s", "notes.md", b"before")
    with psycopg.connect(database_url) as conn:
        before: datetime = conn.execute("SELECT clock_timestamp()").fetchone()[0]
    await store.write("s", "notes.md", b"after")
    for n in range(3):
        await store.write("s", part_path(UPLOAD, n), b"part %d" % n)
    assert history(database_url, "s") == [("notes.md", 1, False), ("notes.md", 2, False)]

    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        async with conn.transaction():
            await _restore_workspace(conn, "s", before)  # a rewind to before the put began
        async with conn.transaction():
            now = (await (await conn.execute("SELECT clock_timestamp()")).fetchone())[0]
            assert await _copy_workspace(conn, "s", "fork", now) == 1
    notes = await store.read("s", "notes.md")
    assert notes is not None and notes.data == b"before"
    assert [f.path for f in await store.list("s", ".keel/")] == [
        part_path(UPLOAD, n) for n in range(3)]  # the put still finds its parts
    assert [f.path for f in await store.list("fork")] == ["notes.md"]

    assert await store.remove("s", f".keel/uploads/{UPLOAD}/") == 3
    assert [p for p, _, _ in history(database_url, "s")] == ["notes.md"] * 3


def test_the_migration_takes_what_the_history_kept_of_parts(database_url):
    """Parts an older trigger kept go when the migration runs; a file beside them stays."""
    with psycopg.connect(database_url) as conn:
        conn.execute("INSERT INTO workspace_file_versions (scope, path, version, data, size)"
                     " VALUES ('s', %s, 1, 'x', 1), ('s', %s, 2, NULL, 0),"
                     " ('s', '.keel/results/c.txt', 1, 'y', 1)",
                     (part_path(UPLOAD, 0), part_path(UPLOAD, 0)))
        conn.execute((MIGRATIONS_DIR / "016_staged_parts_unversioned.sql").read_text())
    assert history(database_url, "s") == [(".keel/results/c.txt", 1, False)]


@pytest.mark.parametrize("staged", [0, 2])
async def test_a_local_snapshot_leaves_parts_out(tmp_path, staged):
    store = LocalStore(tmp_path / "w", tmp_path, 1_000_000, 10_000_000)
    await store.write("s", "report.md", b"done")
    for n in range(staged):
        await store.write("s", part_path(UPLOAD, n), b"part")
    assert len(await store.list("s")) == 1 + staged
    assert [f.path for f in await store.snapshot("s")] == ["report.md"]
