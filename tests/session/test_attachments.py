"""Files sent with a user's message, end to end: put in the session's workspace, described
before the message is numbered, their bytes kept in the record and sent to the model as the
API's image and document blocks; what the model would refuse is refused to the sender with
nothing recorded; a fork and a bundle carry them."""

from __future__ import annotations

import base64
import gzip
import json
import uuid
from typing import Any

import psycopg
import pytest

from keel.client import AttachmentRefusedError, BranchRefusedError
from schemas.attachments import upload_path
from schemas.branch import unsealed
from schemas.interrupt import InterruptPolicy
from schemas.session import CallbackInput, Handler
from tests.attached import image as png
from tests.attached import pdf
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings, until
from tests.session.streams import DELAY_S, streaming


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def rows(database_url: str, session_id: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT seq, type, content_text, content FROM messages WHERE session_id=%s"
            " ORDER BY seq", (session_id,)).fetchall()


def last_user_blocks(request: dict[str, Any]) -> list[dict[str, Any]]:
    return request["messages"][-1]["content"]


def images_in(request: dict[str, Any]) -> list[str]:
    return [b["source"]["data"] for m in request["messages"] for b in m["content"]
            if b["type"] == "image"]


async def test_a_message_with_files_reaches_the_model_as_image_and_document_blocks(
        client, settings, fake_anthropic, database_url):
    fake_anthropic.responder = lambda body: text_message("I see a blue square.")
    shot, report = png(640, 480), pdf(3)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        await session.put_file("reports/q3.pdf", report)
        outcome = await session.ask(
            "what is in the screenshot, and how long is the report?",
            attachments=[("C:\\tmp\\screen.png", shot), "reports/q3.pdf"])
        assert outcome.reply_text == "I see a blue square.", outcome
        listed = {f.path for f in await session.list_files("attachments/")}
        await session.ask("and now?")
        async for _, event in session.events(after=0):  # the stream names the files
            if event.type == "input_recorded":
                assert event.files == ["screen.png", "q3.pdf"]
                break
    blocks = last_user_blocks(fake_anthropic.requests[0])
    assert [b["type"] for b in blocks] == ["image", "document", "text"]
    assert base64.b64decode(blocks[0]["source"]["data"]) == shot
    assert blocks[1]["source"]["media_type"] == "application/pdf"
    assert base64.b64decode(blocks[1]["source"]["data"]) == report
    assert blocks[1]["title"] == "q3.pdf"
    assert blocks[2]["text"].splitlines() == [
        "what is in the screenshot, and how long is the report?",
        f"[attached: screen.png (image/png, 640×480, {len(shot) / 1024:.1f} KB)]",
        f"[attached: q3.pdf (application/pdf, 3 pages, {len(report) / 1024:.1f} KB)]"]
    # The next turn's request is rebuilt from the record: the files are still there.
    assert images_in(fake_anthropic.requests[-1]) == [blocks[0]["source"]["data"]]
    (path,) = listed
    assert path.startswith("attachments/") and path.endswith("/screen.png")
    first = rows(database_url, session.session_id)[0]
    assert first[1] == "user" and first[2].startswith("what is in the screenshot")
    files = first[3]["attachments"]
    assert [f["path"] for f in files] == [path, "reports/q3.pdf"]
    assert [base64.b64decode(f["data"]) for f in files] == [shot, report]
    # The record's count includes the files (at least as the API counts them: the image
    # by its pixels, a PDF page at most 3,000), so the request's estimate sees them.
    counted = fake_anthropic.usages[0].total_input
    assert counted > 640 * 480 // 750 + 3 * 1_500
    with psycopg.connect(database_url) as conn:
        (estimated,) = conn.execute("SELECT token_count FROM messages WHERE session_id=%s"
                                    " AND seq=%s", (session.session_id, first[0])).fetchone()
    assert counted - 2_000 < estimated <= counted + 3 * 1_000


async def test_a_file_the_model_would_refuse_is_refused_and_nothing_is_recorded(
        client, settings, fake_anthropic, database_url):
    fake_anthropic.responder = lambda body: text_message("ok")
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        await session.ask("hello")
        before = rows(database_url, session.session_id)
        with pytest.raises(AttachmentRefusedError) as missing:
            await session.send("look", attachments=["shots/none.png"])
        assert str(missing.value) == (
            "there is no file at shots/none.png in the session's workspace (put it there "
            "first: `keel put`, `put_file`); nothing was recorded")
        await session.put_file("tool.exe", b"MZ\x90\x00\x03\x00")
        with pytest.raises(AttachmentRefusedError, match=r"tool\.exe: Keel can attach images"):
            await session.ask("run this", attachments=["tool.exe"])
        await session.put_file("wide.png", png(8_001, 1))
        with pytest.raises(AttachmentRefusedError, match="8001×1 pixels"):
            await session.send("wide", attachments=["wide.png"])
        # Refused by the client before anything is put or sent: the same words.
        with pytest.raises(AttachmentRefusedError, match="nothing was sent"):
            await session.send("x", attachments=[("t.exe", b"MZ\x90\x00\x03\x00")])
        with pytest.raises(AttachmentRefusedError, match="not int; nothing was sent"):
            await session.send("x", attachments=[5])
        assert not await session.list_files("attachments/")
        assert rows(database_url, session.session_id) == before
        status = await session.status()
        assert status.phase == "idle" and status.pending_inputs == 0
        # The session goes on: a message with only a file is a message.
        await session.ask("", attachments=[("dot.png", png(4, 4))])
        await session.ask("and a note", attachments=[("note.txt", "ship on Friday")])
    assert len(rows(database_url, session.session_id)) == len(before) + 4
    note = rows(database_url, session.session_id)[-2][3]["attachments"][0]
    assert (note["media_type"], base64.b64decode(note["data"])) == (
        "text/plain", b"ship on Friday")


async def test_a_fork_and_a_bundle_carry_the_files(
        client, settings, fake_anthropic, database_url):
    fake_anthropic.responder = lambda body: text_message("ok")
    shot = png(300, 200)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        await session.ask("keep this", attachments=[("shot.png", shot)])
        fork = await keel.fork(session.session_id)
        await keel.session(fork.session_id).ask("what did I send?")
        bundle = await keel.export_session(session.session_id)
        done = await keel.import_session(bundle, new_id=f"{session.session_id}-copy")
        await keel.session(done.session_id).ask("and here?")
        # A bundle whose image is not its description is refused whole.
        lines = unsealed(bundle).splitlines()
        tampered = []
        for line in lines:
            item = json.loads(line)
            content = item["data"].get("content") if item["line"] == "row" else None
            if isinstance(content, dict) and content.get("attachments"):
                content["attachments"][0]["data"] = base64.b64encode(png(301, 200)).decode()
                line = json.dumps(item).encode()
            tampered.append(line)
        assert tampered != lines
        with pytest.raises(BranchRefusedError, match="not the file its bytes make"):
            await keel.import_session(gzip.compress(b"\n".join(tampered) + b"\n"),
                                      new_id=f"{session.session_id}-bad", trust=True)
    wanted = base64.b64encode(shot).decode()
    asked = {json.dumps(r["messages"][-1]["content"][-1]["text"]): r
             for r in fake_anthropic.requests}
    assert images_in(asked['"what did I send?"']) == [wanted]
    assert images_in(asked['"and here?"']) == [wanted]


async def test_a_file_the_api_refuses_all_the_same_is_marked_and_the_turn_goes_on(
        client, settings, fake_anthropic, database_url):
    """A PNG whose header reads but whose body is cut: Keel describes it, the API cannot
    process it. The call asks again without it; the record says why, and no later request
    sends it (before, every turn after it would have failed the same way)."""
    fake_anthropic.responder = lambda body: text_message("ok")
    whole = png(200, 120)
    cut = whole[:len(whole) * 2 // 3]
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        outcome = await session.ask("look", attachments=[("cut.png", cut), ("ok.png", whole)])
        assert outcome.error is None and outcome.reply_text == "ok", outcome
        await session.ask("again")
    refused = [r for r in fake_anthropic.rejections if "Could not process image" in r.message]
    assert len(refused) == 1, fake_anthropic.rejections
    files = rows(database_url, session.session_id)[0][3]["attachments"]
    assert files[0]["refused"].endswith("Could not process image")
    assert "refused" not in files[1]
    for request in fake_anthropic.requests[-2:]:  # the retry and the next turn's
        assert images_in(request) == [base64.b64encode(whole).decode()]
        said = last_user_blocks(request)[-1]["text"] if request is fake_anthropic.requests[-2] \
            else request["messages"][0]["content"][-1]["text"]
        assert "[attached: cut.png (image/png, 200×120, " in said
        assert "(not sent: the model refused it: " in said


async def test_a_refused_file_does_not_stop_the_turn_its_message_would_have_interrupted(
        client, settings, fake_anthropic, database_url):
    """The files are described before the message stops anything: a message sent with
    policy `interrupt` whose file is refused leaves the running turn alone."""
    fake_anthropic.stream_delay_s = DELAY_S
    fake_anthropic.push(text_message(" ".join(f"w{i}" for i in range(120))),
                        text_message("short"))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        first = await session.send("Write a long essay.")
        await streaming(fake_anthropic)
        with pytest.raises(AttachmentRefusedError, match=r"no file at gone\.png"):
            await session.send("Stop; look at this.", on_busy=InterruptPolicy.INTERRUPT,
                               attachments=["gone.png"])
        finished = await session.wait_reply(first.seq)
    assert not finished.interrupted and finished.reply_text.endswith("w119")
    assert [r[2] for r in rows(database_url, session.session_id) if r[1] == "user"] == [
        "Write a long essay."]


async def test_read_file_shows_the_model_an_image_in_the_workspace(
        client, settings, fake_anthropic, database_url):
    """After a checkpoint the memo names a file; the agent can look at it again: read_file
    of an image (or a PDF) answers with the file itself, not a description of bytes."""
    shot = png(90, 60)
    path = upload_path("shot.png", shot)
    look = tool_use_message([("read_file", {"path": path}),
                             ("read_file", {"path": "notes.bin"})])
    image_call, binary_call = (b["id"] for b in look["content"])
    fake_anthropic.push(text_message("noted"), look, text_message("seen again"))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        await session.ask("keep this", attachments=[("shot.png", shot)])
        await session.put_file("notes.bin", b"\x00\x01\x02 binary")
        assert (await session.ask("look at it again")).reply_text == "seen again"
    results = {b["tool_use_id"]: b["content"] for m in fake_anthropic.requests[-1]["messages"]
               for b in m["content"] if b.get("type") == "tool_result"}
    image, said = results[image_call]
    assert image["type"] == "image" and base64.b64decode(image["source"]["data"]) == shot
    assert said["text"].startswith("[attached: shot.png (image/png, 90×60, ")
    assert "binary" in str(results[binary_call])  # any other binary file: described


async def test_search_record_finds_a_message_by_the_name_of_its_file(
        client, settings, fake_anthropic, database_url):
    look = tool_use_message([("search_record", {"query": "contract"})])
    (call,) = (b["id"] for b in look["content"])
    fake_anthropic.push(text_message("noted"), look, text_message("found it"))
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        await session.ask("here it is", attachments=[("deal-contract.pdf", pdf(1))])
        assert (await session.ask("where is the contract I sent?")).reply_text == "found it"
    said = {b["tool_use_id"]: b["content"] for m in fake_anthropic.requests[-1]["messages"]
            for b in m["content"] if b.get("type") == "tool_result"}[call]
    assert "#1 [user] here it is [files: deal-contract.pdf]" in said


async def test_a_first_message_carries_files_and_what_is_refused_starts_nothing(
        client, settings, fake_anthropic, database_url):
    from keel.client import SessionStoppedError

    fake_anthropic.responder = lambda body: text_message("a red square")
    sid = f"s-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as keel:
        with pytest.raises(AttachmentRefusedError, match=r"tool\.exe: Keel can attach"):
            await keel.start_with_message(sid, "look", attachments=[("tool.exe", b"MZ\x90")])
        assert not await keel.session(sid).is_running()  # nothing started
        session, accepted = await keel.start_with_message(
            sid, "what is this?", attachments=[("shot.png", png(64, 48))])
        outcome = await session.wait_reply(accepted.seq)
        # Joined while it runs, as a message without files joins it.
        again, second = await keel.start_with_message(
            sid, "and this?", attachments=[("shot2.png", png(32, 32))])
        await again.wait_reply(second.seq)
        await session.end()
        await session.handle.result()
        with pytest.raises(SessionStoppedError):  # an ended id is never started again
            await keel.start_with_message(sid, "again?", attachments=[("s.png", png(8, 8))])
    assert outcome.reply_text == "a red square" and accepted.seq == 1
    sent = last_user_blocks(fake_anthropic.requests[0])
    assert [b["type"] for b in sent] == ["image", "text"]
    users = [(r[2], [a["name"] for a in r[3]["attachments"]]) for r in rows(database_url, sid)
             if r[1] == "user"]
    assert users == [("what is this?", ["shot.png"]), ("and this?", ["shot2.png"])]


async def test_a_background_input_carries_files_and_one_refused_keeps_its_words(
        client, settings, fake_anthropic, database_url):
    from tests.session.test_inputs import wait_idle

    fake_anthropic.responder = lambda body: text_message("on it")
    shot, spec = png(120, 80), pdf(2)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"s-{uuid.uuid4().hex[:8]}")
        await session.put_file("tickets/spec.pdf", spec)
        await session.task("t-123", "Ticket 123", "the customer's screenshot and spec",
                           attachments=[("ticket shot.png", shot), "tickets/spec.pdf"])
        await wait_idle(session, 1)
        await session.put_file("shots/wide.png", png(9000, 10))  # a path: the session reads it
        await session.watch("w-1", "CI", "a failing run", attachments=["shots/wide.png"])
        await session.callback("run-9", "other", "see this", attachments=["no/such.png"])
        # Another client's signal naming more files than a message may carry: refused by
        # the session before any activity (Keel's client refuses it before sending).
        await session.handle.signal(Handler.CALLBACK, CallbackInput(
            run_id="run-10", from_session="other", text="so many",
            attachments=[f"p{i}.png" for i in range(25)]))
        await wait_idle(session, 2)  # one turn answers them all, or more do

        async def four() -> bool:
            return len([r for r in rows(database_url, session.session_id)
                        if r[1] == "harness"]) == 4

        await until(four)
        with pytest.raises(AttachmentRefusedError, match=r"tool\.exe"):
            await session.task("t-124", "Ticket 124", "x",
                               attachments=[("tool.exe", b"MZ\x90\x00")])
    harness = [r for r in rows(database_url, session.session_id) if r[1] == "harness"]
    by_words = {r[2].split("\n", 1)[0]: r for r in harness}  # signals race each other
    task = by_words["the customer's screenshot and spec"]
    assert [(a["name"], a["media_type"]) for a in task[3]["attachments"]] == [
        ("ticket shot.png", "image/png"), ("spec.pdf", "application/pdf")]
    first = fake_anthropic.requests[0]["messages"][-1]["content"]
    assert [b["type"] for b in first] == ["image", "document", "text"]
    assert base64.b64decode(first[0]["source"]["data"]) == shot
    assert first[2]["text"].startswith('[Harness: Task t-123 "Ticket 123"]\n')
    # Nobody to refuse them to: the words are kept, with why the files were not.
    watch = by_words["a failing run"]
    assert watch[2].startswith("a failing run\n[Keel: its files were not attached: "
                               "wide.png is 9000×10 pixels; the model takes at most 8000")
    assert not (watch[3] or {}).get("attachments")
    assert "there is no file at no/such.png" in by_words["see this"][2]
    assert by_words["so many"][2] == ("so many\n[Keel: its files were not attached: a "
                                      "message may carry at most 20 files; this one has 25]")
    assert len(harness) == 4  # the one Keel's client refused was never sent
