"""`memory_get`: the agent reads a hit of long memory whole, by the path memory_search gave
it; a message of another session's transcript comes with the files it carried, read from
the record, so a screenshot a person showed the agent last week is seen again in a new
session of the scope (activities.memory_tools). Real Temporal, PostgreSQL, the vault's
worker and the fake Messages API."""

from __future__ import annotations

import base64
import re
import uuid
from typing import Any

import pytest

from tests.attached import image
from tests.checkpoint_model import texts
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.mcp.test_images import result_blocks
from tests.session.long_memory import transcribed

HIT = re.compile(r"(daily/\d{4}-\d{2}-\d{2}\.md#[\w.-]+:\d+)")


def result_text(blocks: Any) -> str:
    if isinstance(blocks, str):
        return blocks
    return "\n".join(b.get("text", "") for b in blocks if b.get("type") == "text")


def looker(body: dict[str, Any]) -> dict[str, Any]:
    """"find ..." searches memory, then reads the first transcript hit whole, then the day;
    anything else is acknowledged."""
    last = body["messages"][-1]
    results = [b for b in last["content"] if isinstance(b, dict)
               and b.get("type") == "tool_result"]
    if not results:
        said = texts(last)[-1]
        if said.startswith("find"):
            return tool_use_message([("memory_search", {"query": said.removeprefix("find ")})])
        return text_message("noted")
    asked = next(b for b in body["messages"][-2]["content"] if b.get("type") == "tool_use")
    if asked["name"] == "memory_search":
        hit = HIT.search(result_text(results[0]["content"]))
        assert hit, result_text(results[0]["content"])
        return tool_use_message([("memory_get", {"path": hit.group(1)}),
                                 ("memory_get", {"path": hit.group(1).split("#")[0]}),
                                 ("memory_get", {"path": "cards/notes/Nothing.md"}),
                                 ("memory_get", {"path": "team-b:" + hit.group(1)})])
    return text_message("I see the dashboard again.")


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


async def test_a_message_read_back_from_memory_brings_its_files(
        client, settings, fake_anthropic, tmp_path):
    fake_anthropic.responder = looker
    shot = image(200, 120)
    async with keel_worker(client, settings) as keel:
        monday = await keel.start_session(f"mon-{uuid.uuid4().hex[:8]}")
        await monday.ask("the sales dashboard is broken, see", attachments=[("dash.png", shot)])
        await transcribed(tmp_path / "vault", monday.session_id, 2)
        later = await keel.start_session(f"wed-{uuid.uuid4().hex[:8]}")
        outcome = await later.ask("find sales dashboard")
    assert outcome.reply_text == "I see the dashboard again.", outcome
    request = fake_anthropic.requests[-1]
    calls = [b for b in request["messages"][-2]["content"] if b.get("type") == "tool_use"]
    got = {c["input"]["path"]: result_blocks(request)[c["id"]] for c in calls
           if c["id"] in result_blocks(request)}
    entry, day, missing, other = (c["input"]["path"] for c in calls)
    image_block, said = got[entry]
    assert image_block["type"] == "image"
    assert base64.b64decode(image_block["source"]["data"]) == shot
    assert said["text"].startswith("<memory-context>")
    assert "the sales dashboard is broken, see" in said["text"]
    assert "<!-- keel:" not in said["text"]  # the vault's markers are not the model's
    assert "[attached: dash.png (image/png, 200×120, " in said["text"]
    plain = {c["input"]["path"]: b["content"] for m in request["messages"]
             for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result"
             for c in calls if c["id"] == b["tool_use_id"]}
    assert "the sales dashboard is broken" in result_text(plain[day])
    assert "noted" in result_text(plain[day])  # the day whole: the reply too
    assert "nothing at 'cards/notes/Nothing.md'" in result_text(plain[missing])
    assert "refused" in result_text(plain[other])


PAGE = re.compile(r"\[characters ([\d,]+) to ([\d,]+) of ([\d,]+)(?:; memory_get with "
                  r"offset=(\d+) reads on|; the document's end)\]")


def reader_of(day: str) -> Any:
    """"read the day": the day whole, part after part as each part's last line says, then
    an offset past its end and one that is no number, and a search whose limit is no
    number; anything else is acknowledged."""
    def respond(body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]
        results = [b for b in last["content"] if isinstance(b, dict)
                   and b.get("type") == "tool_result"]
        if not results:
            if texts(last)[-1] == "read the day":
                return tool_use_message([("memory_get", {"path": day})])
            return text_message("noted")
        said = result_text(results[-1]["content"])
        found = PAGE.search(said)
        if found and found[4]:
            return tool_use_message([("memory_get", {"path": day, "offset": int(found[4])})])
        if found:
            return tool_use_message([("memory_get", {"path": day, "offset": 10**9}),
                                     ("memory_get", {"path": day, "offset": "x"}),
                                     ("memory_search", {"query": "abcdefghij",
                                                        "limit": "ten"})])
        return text_message("read it all")
    return respond


async def test_a_long_day_is_read_in_parts_and_none_of_it_is_lost(
        client, settings, fake_anthropic, tmp_path):
    fake_anthropic.responder = lambda body: text_message("noted")
    words = [f"{n:03d}-" + "abcdefghij " * 900 for n in range(3)]  # three 9,904-char notes
    async with keel_worker(client, settings) as keel:
        busy = await keel.start_session(f"busy-{uuid.uuid4().hex[:8]}")
        for said in words:
            await busy.ask(said)
        await transcribed(tmp_path / "vault", busy.session_id, 6)
        [day] = [f"daily/{f.name}" for f in (tmp_path / "vault" / "daily").glob("*.md")]
        fake_anthropic.responder = reader_of(day)
        later = await keel.start_session(f"later-{uuid.uuid4().hex[:8]}")
        outcome = await later.ask("read the day")
    assert outcome.reply_text == "read it all", outcome
    request = fake_anthropic.requests[-1]
    parts = [result_text(b["content"]) for m in request["messages"]
             for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    *pages, past, bad, bad_limit = parts
    assert len(pages) >= 2 and all(p.count("</memory-context>") == 1 for p in pages)
    spans = [PAGE.search(p) for p in pages]
    assert all(s is not None for s in spans)
    assert [int(s[1].replace(",", "")) for s in spans if s] == [
        0, *(int(s[4]) for s in spans[:-1] if s)]  # each part from where the last ended
    whole = "".join(p.split("\n", 3)[3].rsplit("\n</memory-context>", 1)[0] for p in pages)
    assert all(w.strip() in whole for w in words)  # every note, whole, across the parts
    assert "past its end" in past and "is not a count of characters" in bad
    assert "limit 'ten' is not a whole number of hits" in bad_limit
