"""A sub-agent's files come home: what a child writes in its workspace is copied to its
parent's with its answer, which names them; a parent's file a person changed while the
child worked is never overwritten (the child's goes beside it); a child that fails after
writing hands back what it wrote. Real Temporal (dev server), real PostgreSQL, the fake
API playing both sides (tests/session/teams.py)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from schemas.agent import CHILD_NOTE
from tests.fake_anthropic import ErrorStep, text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.session.teams import _awaiting_child, _last, _system, rows, spec

TIDIED = "# Report\n\ntidied by the researcher\n"


def _results(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result")


def team_writing(child_final: Any, before_writing: Any = None, **call: Any) -> Any:
    """The parent delegates report.md with its task (and `call`'s other inputs); the child
    rewrites it, writes notes/summary.md, then answers `child_final` (a reply, or an error
    step)."""
    def respond(body: dict[str, Any]) -> Any:
        if CHILD_NOTE in _system(body):
            if _results(body):
                return child_final
            if before_writing is not None:
                before_writing()
            return tool_use_message([
                ("write_file", {"path": "report.md", "content": TIDIED}),
                ("write_file", {"path": "notes/summary.md", "content": "three points"})])
        last = _last(body)
        if "agent run" in last or "tool_result" in last:
            return text_message("parent done")
        return tool_use_message([("delegate", {"agent": "researcher", "task": "tidy it",
                                               "files": ["report.md"], **call})])
    return respond


def _answer(database_url: str, session_id: str) -> str:
    [found] = [r[2] for r in rows(database_url, session_id)
               if (r[1] or "").startswith("[Harness: agent run ")]
    return found


async def _read(session: Any, path: str) -> bytes | None:
    found = await session.read_file(path)
    return None if found is None else found.data


async def test_the_files_a_child_writes_come_home_with_its_answer(
        temporal_env, database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = team_writing(text_message("tidied it"))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session(f"home-{uuid.uuid4().hex[:6]}", agent=spec())
        await parent.put_file("report.md", "# Report\n\ndraft\n")
        await asyncio.wait_for(parent.ask("tidy the report"), 60)
        [child] = (await parent.status()).children
        assert await _read(parent, "report.md") == TIDIED.encode()  # its edit came home
        assert await _read(parent, "notes/summary.md") == b"three points"
        await parent.end()
    answer = _answer(database_url, parent.session_id)
    assert answer == ("tidied it\n\n[Keel: the files it wrote are in your workspace: "
                      "notes/summary.md, report.md (your file, as it edited it)]")
    assert child.done == "answered"


async def test_a_call_that_names_what_to_bring_back_gets_only_that(
        temporal_env, database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = team_writing(text_message("tidied it"),
                                            bring_back=["notes/*"])
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session(f"only-{uuid.uuid4().hex[:6]}", agent=spec())
        await parent.put_file("report.md", "# Report\n\ndraft\n")
        await asyncio.wait_for(parent.ask("tidy the report"), 60)
        [child] = (await parent.status()).children
        assert await _read(parent, "report.md") == b"# Report\n\ndraft\n"  # not asked back
        assert await _read(parent, "notes/summary.md") == b"three points"
        await parent.end()
    assert _answer(database_url, parent.session_id) == (
        "tidied it\n\n[Keel: the files it wrote are in your workspace: notes/summary.md; "
        f"left in its workspace (session {child.session_id}): 1 other file (not asked back)]")


async def test_a_file_a_person_changed_meanwhile_is_not_overwritten(
        temporal_env, database_url, fake_anthropic, tmp_path):
    go = threading.Event()
    fake_anthropic.responder = team_writing(text_message("tidied it"),
                                            lambda: go.wait(30))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session(f"kept-{uuid.uuid4().hex[:6]}", agent=spec())
        await parent.put_file("report.md", "# Report\n\ndraft\n")
        asked = asyncio.create_task(parent.ask("tidy the report"))
        [child] = (await _awaiting_child(parent)).children
        await parent.put_file("report.md", "# Report\n\nthe person's own edit\n")
        go.set()
        await asyncio.wait_for(asked, 60)
        beside = f"subagents/researcher-{child.call_id[-8:]}/report.md"
        assert await _read(parent, "report.md") == b"# Report\n\nthe person's own edit\n"
        assert await _read(parent, beside) == TIDIED.encode()
        await parent.end()
    assert _answer(database_url, parent.session_id).endswith(
        f"notes/summary.md, report.md (at {beside}: your report.md is another file)]")


async def test_a_child_that_fails_after_writing_hands_back_what_it_wrote(
        temporal_env, database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = team_writing(ErrorStep(400, message="bad request"))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session(f"failed-{uuid.uuid4().hex[:6]}", agent=spec())
        await parent.put_file("report.md", "# Report\n\ndraft\n")
        await asyncio.wait_for(parent.ask("tidy the report"), 60)
        [child] = (await parent.status()).children
        assert child.done == "failed"
        assert await _read(parent, "notes/summary.md") == b"three points"
        await parent.end()
    answer = _answer(database_url, parent.session_id)
    assert answer.startswith("Sub-agent researcher failed: ")
    assert answer.endswith("[Keel: the files it wrote are in your workspace: "
                           "notes/summary.md, report.md (your file, as it edited it)]")


def _chart(width: int = 64) -> bytes:
    """A real PNG, as a chart a child drew (the fake API opens every image it is sent)."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, width // 2), (30, 120, 200)).save(out, format="PNG")
    return out.getvalue()


def _drawing(settings: Any) -> Any:
    """Before the child writes its text files, a chart appears in its workspace (as a
    plotting tool of the child's would draw it)."""
    def draw() -> None:
        for folder in settings.workspaces_dir.glob("*.researcher.*"):
            (folder / "charts").mkdir(parents=True, exist_ok=True)
            (folder / "charts" / "sales.png").write_bytes(_chart())
    return draw


def _images_in_answer(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The image blocks of the parent's request message that holds the child's answer."""
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, list) and any(
                "[Harness: agent run " in (b.get("text") or "") for b in content):
            return [b for b in content if b.get("type") == "image"]
    return []


@pytest.mark.parametrize("child_final", [text_message("drew it"),
                                         ErrorStep(400, message="bad request")],
                         ids=["answered", "failed"])
async def test_the_images_that_come_home_are_shown_with_the_answer(
        temporal_env, database_url, fake_anthropic, tmp_path, child_final):
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    fake_anthropic.responder = team_writing(child_final, before_writing=_drawing(settings))
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session(f"draw-{uuid.uuid4().hex[:6]}", agent=spec())
        await parent.put_file("report.md", "# Report\n\ndraft\n")
        await asyncio.wait_for(parent.ask("chart the sales"), 60)
        assert await _read(parent, "charts/sales.png") == _chart()
        await parent.end()
    answer = _answer(database_url, parent.session_id)
    assert "charts/sales.png" in answer and "not attached" not in answer
    [after] = [b for b in fake_anthropic.requests if CHILD_NOTE not in _system(b)
               and _images_in_answer(b)][-1:]
    [image] = _images_in_answer(after)
    assert image["source"]["media_type"] == "image/png"
