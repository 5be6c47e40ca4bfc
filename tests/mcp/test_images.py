"""Images an MCP tool returns, in a real session (a stdio server, the fake Messages API):
kept in the session's workspace and sent with the call's result as image blocks, their kind
read from their bytes; one the model would refuse is said in the result instead; one the API
refuses all the same is marked and never sent again. Before, every image was the line
"[image content (image/png) not shown]": a browser's screenshot tool showed the agent
nothing."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest

from schemas.agent import AgentSpec
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.mcp.conftest import IMAGES, results, stdio_spec


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def result_blocks(request: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {b["tool_use_id"]: b["content"] for m in request["messages"]
            for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result"
            and isinstance(b["content"], list)}


async def test_a_tools_images_reach_the_model_with_its_result(
        client, settings, fake_anthropic, database_url):
    calls = tool_use_message([("mcp__images__screenshot", {"width": 320, "height": 200}),
                              ("mcp__images__mislabelled", {}),
                              ("mcp__images__panorama", {})])
    shot, wrong, wide = (b["id"] for b in calls["content"])
    fake_anthropic.push(calls, text_message("I see it."), text_message("still there"))
    spec = AgentSpec(mcp_servers=[stdio_spec(IMAGES, name="images", call_s=30)])
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"img-{uuid.uuid4().hex[:8]}", agent=spec)
        assert (await session.ask("Look at the page.")).reply_text == "I see it."
        assert (await session.ask("And now?")).reply_text == "still there"
        kept = {f.path for f in await session.list_files("attachments/")}
    sent = result_blocks(fake_anthropic.requests[1])
    image, said = sent[shot]
    assert image["type"] == "image" and image["source"]["media_type"] == "image/png"
    assert said["text"].splitlines()[0] == "the page at 320x200"
    assert said["text"].splitlines()[1].startswith("[attached: screenshot-")
    assert "(image/png, 320×200, " in said["text"]
    # The server called a JPEG image/png: it goes as what its bytes are.
    assert sent[wrong][0]["source"]["media_type"] == "image/jpeg"
    got = results(database_url, session.session_id)
    assert "not shown: " in got[wide][0] and "9000×10 pixels" in got[wide][0]
    assert wide not in sent  # nothing to send but its text
    assert len(kept) == 2
    assert [a["media_type"] for a in got[shot][1]["attachments"]] == ["image/png"]
    # Rebuilt from the record on the next turn: the same bytes.
    assert result_blocks(fake_anthropic.requests[2])[shot][0] == image
    assert base64.b64decode(image["source"]["data"]).startswith(b"\x89PNG")


async def test_an_image_the_api_cannot_process_is_marked_and_the_turn_goes_on(
        client, settings, fake_anthropic, database_url):
    calls = tool_use_message([("mcp__images__cut", {})])
    (cut,) = (b["id"] for b in calls["content"])
    fake_anthropic.push(calls, text_message("done"))
    spec = AgentSpec(mcp_servers=[stdio_spec(IMAGES, name="images", call_s=30)])
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"imgc-{uuid.uuid4().hex[:8]}", agent=spec)
        outcome = await session.ask("Look.")
    assert outcome.error is None and outcome.reply_text == "done", outcome
    (item,) = results(database_url, session.session_id)[cut][1]["attachments"]
    assert item["refused"].endswith("Could not process image")
    last = result_blocks(fake_anthropic.requests[-1])[cut]
    assert [b["type"] for b in last] == ["text"]
    assert "(not sent: the model refused it: " in last[0]["text"]


async def test_a_tools_embedded_pdf_reaches_the_model_and_a_zip_is_a_line(
        client, settings, fake_anthropic, database_url):
    calls = tool_use_message([("mcp__images__report", {})])
    (call_id,) = (b["id"] for b in calls["content"])
    fake_anthropic.push(calls, text_message("I read the report."))
    spec = AgentSpec(mcp_servers=[stdio_spec(IMAGES, name="images", call_s=30)])
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"res-{uuid.uuid4().hex[:8]}", agent=spec)
        assert (await session.ask("Read May's report.")).reply_text == "I read the report."
    document, said = result_blocks(fake_anthropic.requests[1])[call_id]
    assert document["type"] == "document"
    assert document["source"]["media_type"] == "application/pdf"
    assert base64.b64decode(document["source"]["data"]).startswith(b"%PDF")
    lines = said["text"].splitlines()
    assert lines[0] == "the May report" and "[binary resource" not in said["text"]
    assert lines[1].startswith("[resource file:///reports/may.zip not shown: may.zip: Keel "
                               "can attach images")
    assert "[attached: may.pdf (application/pdf, 1 page, " in said["text"]
