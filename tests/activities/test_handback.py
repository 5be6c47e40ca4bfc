"""A child's files copied home by `activities.handback.hand_back` on a real store (a
folder per session): the cap, Keel's own files, the parent's limits, a retry. No server."""

from __future__ import annotations

import hashlib
from pathlib import Path

from activities.handback import HandBack, hand_back
from activities.workspace import LocalStore
from schemas.attachments import describe
from schemas.handback import HANDBACK_SHOWN

PARENT, CHILD = "team", "team.researcher.toolu_01ABCDEFGHIJKLMNOPQRSTUV"


def _store(tmp_path: Path, workspace_bytes: int = 10_000_000) -> LocalStore:
    return LocalStore(tmp_path / "ws", tmp_path, 1_000_000, workspace_bytes)


async def test_past_the_cap_and_past_the_parents_limit_files_stay_named(tmp_path):
    child = _store(tmp_path)
    for i in range(130):
        await child.write(CHILD, f"f{i:03}.md", b"x" * 10)
    await child.write(CHILD, "big.md", b"y" * 60_000)  # past the parent's 50,000 bytes
    await child.write(CHILD, ".keel/results/1.json", b"{}")  # Keel's own: never copied
    store = _store(tmp_path, workspace_bytes=50_000)  # the same folders, smaller limits
    line = (await hand_back(store, HandBack(child_session=CHILD, parent_session=PARENT,
                                            call_id="toolu_01ABCDEFGHIJKLMNOPQRSTUV"))).line
    home = {f.path for f in await store.list(PARENT)}
    assert "big.md" not in home and not any(p.startswith(".keel/") for p in home)
    assert len(home) == 99  # big.md is first in order and took one of the hundred
    assert "left in its workspace (session " + CHILD + "): big.md (" in line
    assert line.endswith("): big.md (the workspace would be 60,000 bytes; the limit is "
                         "50,000 bytes), 31 more files (past the first 100)]")
    assert len(line) < 2_000


async def test_a_given_file_left_alone_stays_and_a_retry_writes_nothing_twice(tmp_path):
    store = _store(tmp_path)
    given = b"# Report\n\ndraft\n"
    await store.write(PARENT, "report.md", given)
    await store.write(CHILD, "report.md", given)  # given with the task, left as it was
    await store.write(CHILD, "chart.md", b"bars")
    item = describe("report.md", given)
    assert not isinstance(item, str) and item.sha256 == hashlib.sha256(given).hexdigest()
    data = HandBack(child_session=CHILD, parent_session=PARENT, call_id="c1", shared=[item])
    first = (await hand_back(store, data)).line
    versions = {f.path: f.version for f in await store.list(PARENT)}
    assert (await hand_back(store, data)).line == first  # the retry: the same line
    assert {f.path: f.version for f in await store.list(PARENT)} == versions == {
        "report.md": 1, "chart.md": 1}
    assert first == "[Keel: the files it wrote are in your workspace: chart.md]"


async def test_a_name_put_in_its_folder_by_hand_that_no_workspace_takes_stays(tmp_path):
    store = _store(tmp_path)
    await store.write(CHILD, "ok.md", b"fine")
    (store.folder(CHILD) / "bad\nname.md").write_bytes(b"by hand")
    line = (await hand_back(store, HandBack(child_session=CHILD, parent_session=PARENT,
                                            call_id="c1"))).line
    assert line == (f"[Keel: the files it wrote are in your workspace: ok.md; left in its "
                    f"workspace (session {CHILD}): 'bad\\nname.md' (a name no workspace "
                    "takes)]")
    assert "\n" not in line


async def test_only_the_files_the_call_asked_back_come_home_the_rest_counted(tmp_path):
    store = _store(tmp_path)
    given, edited = b"# Report\n", b"# Report\n\nfinal\n"
    await store.write(PARENT, "report.md", given)
    await store.write(PARENT, "data.csv", b"a,b\n")
    await store.write(CHILD, "data.csv", b"a,b\n")  # given and left as it was: not counted
    await store.write(CHILD, "report.md", edited)  # given and edited: not asked back
    await store.write(CHILD, "charts/q3.png", b"\x89PNG")
    await store.write(CHILD, "scratch.txt", b"tmp")
    shared = [describe("report.md", given), describe("data.csv", b"a,b\n")]
    assert all(not isinstance(s, str) for s in shared)
    line = (await hand_back(store, HandBack(
        child_session=CHILD, parent_session=PARENT, call_id="c1",
        shared=[s for s in shared if not isinstance(s, str)], only=["*.png"]))).line
    home = {f.path for f in await store.list(PARENT)}
    assert home == {"report.md", "data.csv", "charts/q3.png"}
    assert (await store.read(PARENT, "report.md")).data == given
    assert line == ("[Keel: the files it wrote are in your workspace: charts/q3.png; left in "
                    f"its workspace (session {CHILD}): 2 other files (not asked back)]")


def _png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 60, 60)).save(out, format="PNG")
    return out.getvalue()


async def test_the_first_images_the_model_takes_are_shown_the_rest_named(tmp_path):
    store = _store(tmp_path)
    await store.write(CHILD, "a_notes.md", b"# notes")  # text: named, never shown
    await store.write(CHILD, "b_huge.png", _png(9_000, 10))  # past the model's sides
    await store.write(CHILD, "c_broken.png", b"\x89PNG\r\n\x1a\n not whole")
    for i in range(HANDBACK_SHOWN + 2):
        await store.write(CHILD, f"d{i}.png", _png(40 + i, 20))
    await store.write(PARENT, "d0.png", b"the parent's own")  # it goes beside: shown there
    home = await hand_back(store, HandBack(child_session=CHILD, parent_session=PARENT,
                                           call_id="toolu_01ABCDEFGHIJKLMNOPQRSTUV"))
    beside = "subagents/researcher-OPQRSTUV/d0.png"
    assert home.shown == [beside] + [f"d{i}.png" for i in range(1, HANDBACK_SHOWN)]
    assert (await store.read(PARENT, beside)).data == _png(40, 20)
    assert "b_huge.png" in home.line and f"d{HANDBACK_SHOWN + 1}.png" in home.line
