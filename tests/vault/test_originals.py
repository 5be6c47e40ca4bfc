"""A message's files kept as originals in its scope's vault, by date, linked from the day's
transcript (schemas.vault.originals, activities.vault.originals): their paths and links,
written before the entry and once, and deleted with the last entry that links them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg.types.json import Jsonb

from activities.bundle_memory import BundleMemoryActivities
from activities.vault.turn import MemoryActivities, TranscriptsInput
from schemas.attachments import Attachment, describe, stored
from schemas.bundle_memory import BundleMemoryRequest
from schemas.vault.originals import (
    NAME_CHARS,
    daily_day,
    entry_text,
    linked_originals,
    original_path,
)
from tests.attached import image, pdf
from tests.vault.support import run_activity, vault_ctx
from workers.worker import model_backends

T0 = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
DAY = "2026-06-01"


def item(name: str, data: bytes) -> dict:
    found = describe(name, data)
    assert isinstance(found, Attachment), found
    return stored(found, data)


def test_an_originals_path_is_its_day_its_digest_and_a_safe_name():
    shot = item("shot.png", image(40, 30))
    assert original_path(DAY, shot) == f"attachments/{DAY}/{shot['sha256'][:12]}-shot.png"
    assert original_path(DAY, {**shot, "name": "shot.png"}) == original_path(DAY, shot)
    other = item("shot.png", image(41, 30))
    assert original_path(DAY, other) != original_path(DAY, shot)  # other bytes, other file
    for name in ('a:b*c?"d<e>f|g#h^i[j]k%l\x01.png', ".hidden.png", "..png"):
        rel = original_path(DAY, {**shot, "name": name})
        last = rel.rsplit("/", 1)[1].split("-", 1)[1]
        assert rel.count("/") == 2 and not last.startswith(".")
        assert not set(last) & set('\\/:*?"<>|#^[]%\x01')
    long = original_path(DAY, {**shot, "name": "x" * 300 + ".png"}).rsplit("-", 1)[1]
    assert len(long) == NAME_CHARS and long.endswith(".png")
    with pytest.raises(ValueError, match="not a day"):
        original_path("../2026-06-01", shot)


def test_an_entry_links_each_original_and_only_such_links_are_read_back():
    shot, doc = item("my shot (1).png", image(40, 30)), item("Спецификация.pdf", pdf(2))
    notes = item("notes.txt", b"plain words\n")
    text = entry_text("see these", [shot, doc, notes], DAY)
    lines = text.split("\n")
    assert lines[0] == "see these" and lines[1].startswith("[attached: my shot (1).png")
    assert lines[2].startswith("![my shot (1).png](../attachments/2026-06-01/")
    assert lines[4].startswith("![Спецификация.pdf](../attachments/")  # a PDF embeds
    assert lines[6].startswith("[notes.txt](../attachments/")  # text is a link
    assert linked_originals(text, DAY) == {original_path(DAY, i) for i in (shot, doc, notes)}
    assert linked_originals(text, "2026-06-02") == set()  # another day's folder
    digest = shot["sha256"][:12]
    forged = "\n".join([
        "[x](../CORE.md)", f"[x](../attachments/2026-06-01/../{digest}-CORE.md)",
        f"[x](../attachments/2026-06-01/{digest}-a%2F..%2F..%2FCORE.md)",
        "[x](../attachments/2026-06-01/nodigest.png)", f"[x](attachments/{DAY}/{digest}-a.png)"])
    assert linked_originals(forged, DAY) == set()
    assert (daily_day("daily/2026-06-01.md"), daily_day("summaries/daily/2026-06-01.md"),
            daily_day("daily/notes.md")) == ("2026-06-01", None, None)


def insert_with_files(database_url: str, session_id: str, seq: int, text: str,
                      files: list[dict], at: datetime = T0) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO sessions (session_id) VALUES (%s) ON CONFLICT DO NOTHING",
                     (session_id,))
        conn.execute(
            "INSERT INTO messages (session_id, seq, input_id, type, content_text, content,"
            " token_count, created_at) VALUES (%s, %s, %s, 'user', %s, %s, 10, %s)",
            (session_id, seq, f"in-{seq}", text, Jsonb({"attachments": files}), at))


async def test_originals_are_written_once_before_their_entry_and_forgotten_with_it(
        tmp_path, database_url):
    ctx = vault_ctx(tmp_path, database_url)
    acts = MemoryActivities(ctx, model_backends())
    one, two = f"s-{uuid.uuid4().hex[:6]}", f"s-{uuid.uuid4().hex[:6]}"
    made = {"shared": image(40, 30), "mine": pdf(3), "theirs": image(50, 30)}
    shared, mine, theirs = (item("shot.png", made["shared"]), item("spec.pdf", made["mine"]),
                            item("shot.png", made["theirs"]))
    insert_with_files(database_url, one, 1, "look at these", [shared, mine])
    insert_with_files(database_url, two, 1, "the same shot", [shared, theirs])
    for sid in (one, two):
        done = await run_activity(acts.append_transcripts,
                                  TranscriptsInput(session_id=sid, seqs=[1]))
        assert done.results[0].appended
    root = ctx.vault.root
    kept = sorted(p.relative_to(root).as_posix() for p in root.glob("attachments/*/*"))
    assert kept == sorted(original_path(DAY, i) for i in (shared, mine, theirs))
    for i, data in ((shared, made["shared"]), (mine, made["mine"]),
                    (theirs, made["theirs"])):
        assert (root / original_path(DAY, i)).read_bytes() == data
    daily = (root / "daily" / f"{DAY}.md").read_text()
    assert f"![shot.png](../{original_path(DAY, shared)})" in daily
    assert daily.count(f"(../{original_path(DAY, shared)})") == 2  # one file, two links
    # A retry after the originals were written appends and writes nothing again.
    (root / original_path(DAY, mine)).write_bytes(b"a person's edit")
    again = await run_activity(acts.append_transcripts,
                               TranscriptsInput(session_id=one, seqs=[1]))
    assert not again.results[0].appended
    assert (root / original_path(DAY, mine)).read_bytes() == b"a person's edit"
    # Forgetting a session takes the originals only its entries linked.
    forget = BundleMemoryActivities(ctx).forget_session_memory
    gone = await run_activity(forget, BundleMemoryRequest(
        request_id="f1", direction="forget", scope="default", session_id=one))
    assert gone.entries == 1
    assert not (root / original_path(DAY, mine)).exists()
    assert (root / original_path(DAY, shared)).is_file()  # the other session links it
    await run_activity(forget, BundleMemoryRequest(
        request_id="f2", direction="forget", scope="default", session_id=two))
    assert not list(root.glob("attachments/*/*"))
    assert not (root / "attachments" / DAY).exists()  # its day's folder too, once empty


async def test_a_message_without_files_writes_no_original_and_its_entry_is_as_before(
        tmp_path, database_url):
    ctx = vault_ctx(tmp_path, database_url)
    sid = f"s-{uuid.uuid4().hex[:6]}"
    insert_with_files(database_url, sid, 1, "[x](../CORE.md) words only", [])
    await run_activity(MemoryActivities(ctx, model_backends()).append_transcripts,
                       TranscriptsInput(session_id=sid, seqs=[1]))
    daily = (ctx.vault.root / "daily" / f"{DAY}.md").read_text()
    assert daily.rstrip().endswith("[x](../CORE.md) words only")
    assert not list(ctx.vault.root.glob("attachments/*/*"))
