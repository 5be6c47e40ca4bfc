"""Files a service tool returns (`ServiceToolResult.files`) reach the model with its result,
as a message's files do: kept in the session's workspace, stored in the result's row,
sent inside the tool_result as image and document blocks, their kind read from their bytes;
one the model would refuse is a line of the result. Inline (the service's worker a real
second process) and by reference (a result over 256 KiB, kept in Keel's store by the
service's converter). Before, a service tool could return text and JSON only: a chart or a
screenshot reached the model as base64 in the result's text."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from activities.attachments import keep_files
from activities.workspace import LocalStore
from keel.service import ServiceToolResult, ServiceToolset, ToolFile
from schemas.agent import AgentSpec, result_files, result_text
from tests.agent.test_big_results import tool_result
from tests.attached import image
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.mcp.test_images import result_blocks
from workers.payload_refs import RESULT_BY_REFERENCE_BYTES, service_converter


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def test_a_results_files_are_read_from_its_json_and_plain_json_stays_json():
    made = ServiceToolResult(text="chart", files=[ToolFile(name="a.png", data=b"\xfb\xff")])
    value = made.model_dump(mode="json")
    assert result_text(value) == ("chart", False)
    assert result_files(value) == [{"name": "a.png", "data": "-_8="}]  # pydantic's alphabet
    assert result_files(ServiceToolResult(text="x").model_dump(mode="json")) == []
    # A service's own data that happens to have a "files" key is its data, as before.
    for plain in ({"files": ["a.txt"]}, {"text": "x", "files": ["a.txt"]},
                  {"text": "x", "files": [{"name": "a", "data": 1}]},
                  {"text": "x", "other": 1, "files": []}):
        assert result_files(plain) == []
        assert result_text(plain)[0].startswith("{")


async def test_a_service_tools_files_reach_the_model_with_its_result(
        client, settings, fake_anthropic, database_url, service_queue):
    from tests.agent.service_worker import misbehaving_toolset

    queue, _ = service_queue
    calls = tool_use_message([("chart", {"width": 64, "height": 48})])
    (call_id,) = (b["id"] for b in calls["content"])
    fake_anthropic.push(calls, text_message("I see the chart."), text_message("still"))
    spec = AgentSpec(tools=misbehaving_toolset(queue).declarations())
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"tf-{uuid.uuid4().hex[:8]}", agent=spec)
        assert (await session.ask("Chart today's orders.")).reply_text == "I see the chart."
        assert (await session.ask("And now?")).reply_text == "still"
        kept = sorted(f.path.rsplit("/", 1)[1] for f in await session.list_files("attachments/"))
    sent = result_blocks(fake_anthropic.requests[1])[call_id]
    assert [(b["type"], b["source"]["media_type"]) for b in sent[:3]] == [
        ("image", "image/png"), ("document", "application/pdf"), ("document", "text/plain")]
    assert sent[2]["source"]["data"] == "12 orders, 3 late\n"
    said = sent[3]["text"]
    assert said.startswith("orders chart 64x48\n[file 4 (panorama.png) not shown: ")
    assert "9000×10 pixels" in said
    assert "[attached: orders.png (image/png, 64×48, " in said and "[attached: notes.txt" in said
    assert kept == ["notes.txt", "orders.png", "sheet.pdf"]
    text, content = tool_result(database_url, session.session_id)
    assert said.startswith(text) and "[attached:" not in text  # the lines come with the files
    assert [a["name"] for a in content["attachments"]] == ["orders.png", "sheet.pdf",
                                                           "notes.txt"]
    # The next turn's request is rebuilt from the record: the same blocks.
    assert result_blocks(fake_anthropic.requests[2])[call_id][:3] == sent[:3]


async def test_the_files_of_a_result_kept_by_reference_reach_the_model(
        client, settings, fake_anthropic, database_url):
    tools = ServiceToolset(task_queue=f"shots-{uuid.uuid4().hex[:8]}")
    shot = image(320, 200)
    log = "line of the crawl log\n" * (RESULT_BY_REFERENCE_BYTES // 20)

    @tools.tool(description="Crawl a page: its log and a screenshot.")
    async def crawl(url: str) -> ServiceToolResult:
        return ServiceToolResult(text=log, files=[ToolFile(name="page.png", data=shot)])

    calls = tool_use_message([("crawl", {"url": "https://example.com"})])
    (call_id,) = (b["id"] for b in calls["content"])
    fake_anthropic.push(calls, text_message("crawled"))
    own = Client(client.service_client, namespace=client.namespace,
                 data_converter=service_converter(settings))
    async with Worker(own, task_queue=tools.task_queue, activities=tools.activities()), \
            keel_worker(client, settings) as keel:
        session = await keel.start_session(f"tfr-{uuid.uuid4().hex[:8]}",
                                           agent=AgentSpec(tools=tools.declarations()))
        assert (await session.ask("Crawl it.")).reply_text == "crawled"
        history = await session.handle.fetch_history()
    text, content = tool_result(database_url, session.session_id)
    assert content["by_reference"] and content["cut"] and text.startswith(log[:20_000])
    assert [a["name"] for a in content["attachments"]] == ["page.png"]
    sent: list[dict[str, Any]] = result_blocks(fake_anthropic.requests[1])[call_id]
    assert sent[0]["type"] == "image" and base64.b64decode(sent[0]["source"]["data"]) == shot
    # The screenshot's bytes never rode in the session's history.
    assert base64.b64encode(shot)[:4000].decode() not in history.to_json()


async def test_a_files_name_is_a_label_and_data_the_workspace_cannot_take_is_a_line(tmp_path):
    store = LocalStore(tmp_path / "w", tmp_path, max_file_bytes=1 << 20,
                       max_workspace_bytes=1 << 24)
    png = base64.b64encode(image(8, 8)).decode()
    paths, said = await keep_files(store, "s1", "call-1", [
        {"name": "..", "data": png}, {"name": "dir/a\nforged line.png", "data": png},
        {"name": "x" * 300 + ".png", "data": png}, {"name": "b.png", "data": "not base64!"},
        {"name": "c.png", "data": png.rstrip("=")}])  # pydantic's unpadded form
    # A name is a label (schemas.attachments.upload_path): one that no path could hold is
    # made one, never a forged line, never the reason an image is lost.
    assert [p.rsplit("/", 1)[1] for p in paths] == [
        "file-1", "a_forged line.png", "x" * 193 + "….png", "c.png"]
    assert all("\n" not in p for p in paths)
    assert [(await store.read("s1", p)).data for p in paths] == [image(8, 8)] * 4
    assert said == ["[file 4 (b.png) not shown: its data is not base64]"]


async def test_a_result_of_many_files_keeps_twenty_and_says_the_rest_in_one_line(tmp_path):
    store = LocalStore(tmp_path / "w", tmp_path, max_file_bytes=1 << 20,
                       max_workspace_bytes=1 << 24)
    many = [{"name": f"p{i}.png", "data": base64.b64encode(image(8 + i, 8)).decode()}
            for i in range(30)]
    paths, said = await keep_files(store, "s1", "call-2", many)
    assert len(paths) == 20 and said == [
        "[10 more not shown: a result shows at most 20 files, and says why of as many]"]
    junk = [{"name": f"j{i}.bin", "data": "%%"} for i in range(10_000)]
    paths, said = await keep_files(store, "s1", "call-3", junk)
    assert paths == [] and len(said) == 21 and said[-1].startswith("[9980 more not shown")
