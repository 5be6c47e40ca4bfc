"""The scenarios with files, on the fake Messages API:

- `history-attachments`: on the fake Messages API, messages with files: bytes put through
  the session and a workspace file sent with the words, a file refused before the message
  is numbered (its Update rejected, nothing recorded), a message of files alone, and the
  end;
- `history-tool-files` (and its child, named by its own id): on the fake Messages API, a
  service tool (on its own worker) whose result carries files, under the patch
  `service-tool-files`: one kept and sent with the result, one too wide for the model said
  in a line; a Task with a file and a Watch whose file is refused (its words kept), under
  `background-input-files`; a delegate call whose file goes to its child with the task,
  under `delegate-files`; and the end;
- `history-handback` (and its children): a sub-agent writes a file and answers (its final
  model call copies the file home), another writes one and fails, answering at its end
  under the patch `delegate-hand-back` (the file copied home first); and the end;
- `history-handback-shown` (and its children): the same with a chart the sub-agents draw
  beside their notes, under the patch `delegate-hand-back-shown`: the answer told by the
  final model call and the one sent at the failed child's end each recorded with the chart
  shown, the waiting call going on once it is recorded.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio.worker import Worker

from keel.client import AttachmentRefusedError, KeelClient, SessionHandle
from keel.service import ServiceToolResult, ServiceToolset, ToolFile
from schemas.agent import CHILD_NOTE, AgentSpec
from schemas.attachments import upload_path
from schemas.config import KeelSettings
from schemas.initiative import SubAgent
from scripts.histories.common import OUT
from tests.fake_anthropic import ErrorStep, text_message, tool_use_message


def attachments_model(body: dict[str, Any]) -> dict[str, Any]:
    seen = sum(b.get("type") in ("image", "document") for m in body["messages"]
               for b in m["content"] if isinstance(m["content"], list))
    return text_message(f"I see {seen} file(s).")


def png(width: int, height: int) -> bytes:
    from PIL import Image  # a dev dependency, as the scripts' other test parts

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (20, 80, 160)).save(buf, "PNG")
    return buf.getvalue()


async def attachments_scenario(keel: KeelClient, settings: KeelSettings,
                               session_id: str) -> SessionHandle:
    session = await keel.start_session(session_id)
    await session.put_file("notes/plan.md", "# Plan\n- ship on Friday\n")
    await session.ask("Does the plan match the screenshot?",
                      attachments=[("screen.png", png(320, 200)), "notes/plan.md"])
    with contextlib.suppress(AttachmentRefusedError):
        await session.send("and this one?", attachments=["notes/missing.png"])
    await session.ask("", attachments=[("second.png", png(64, 64))])
    await session.ask("thanks")
    await session.end()
    return session


TICKET = png(64, 48)


def tool_files_model(body: dict[str, Any]) -> dict[str, Any]:
    if CHILD_NOTE in json.dumps(body.get("system") or ""):  # the sub-agent sees its file
        return text_message("a blue rectangle")
    last = json.dumps(body["messages"][-1]["content"])
    if "tool_result" in last or "agent run" in last:
        return text_message("I see it.")
    if "Delegate" in last:
        return tool_use_message([("delegate", {"agent": "looker", "task": "describe it",
                                               "files": [upload_path("ticket.png", TICKET)]})])
    if "Chart" not in last:
        return text_message("noted")
    return tool_use_message([("chart", {"width": 120, "height": 80})])


async def tool_files_scenario(keel: KeelClient, settings: KeelSettings,
                              session_id: str) -> SessionHandle:
    tools = ServiceToolset(task_queue=f"{settings.task_queue}-charts")

    @tools.tool(description="The day's orders as a chart.")
    async def chart(width: int, height: int) -> ServiceToolResult:
        return ServiceToolResult(text="orders", files=[
            ToolFile(name="orders.png", data=png(width, height)),
            ToolFile(name="wide.png", data=png(9000, 10))])  # refused: a line instead

    async with Worker(keel.client, task_queue=tools.task_queue,
                      activities=tools.activities()):
        session = await keel.start_session(session_id, agent=AgentSpec(
            tools=tools.declarations(),
            sub_agents=[SubAgent(name="looker", instructions="You look at images.")]))
        await session.ask("Chart today's orders.")
        await session.put_file("shots/wide.png", png(9000, 10))
        await session.task("t-1", "Ticket 1", "the customer's screenshot",
                           attachments=[("ticket.png", TICKET)])
        await session.watch("w-1", "CI", "a failing run", attachments=["shots/wide.png"])
        await session.ask("and the tickets?")  # after the background inputs' turns
        await session.ask("Delegate the ticket's screenshot.")
        [child] = (await session.status()).children
        await session.end()
    history = await keel.session(child.session_id).handle.fetch_history()
    (OUT / f"{child.session_id}.json").write_text(history.to_json())  # named by its id
    return session


def handback_model(body: dict[str, Any]) -> Any:
    last = json.dumps(body["messages"][-1]["content"])
    if CHILD_NOTE in json.dumps(body.get("system") or ""):  # a writer: a file, then its end
        if "tool_result" not in last:
            return tool_use_message([("write_file", {"path": "notes.md", "content": "3"})])
        failing = "fail" in json.dumps(body["messages"][0]["content"])
        return ErrorStep(400, message="bad request") if failing else text_message("wrote it")
    if "tool_result" in last or "Write" not in last:
        return text_message("noted")
    task = "Write the notes, and fail." if "fail" in last else "Write the notes."
    return tool_use_message([("delegate", {"agent": "writer", "task": task})])


def handback_shown_model(workspaces: Path) -> Callable[[dict[str, Any]], Any]:
    """`handback_model`, with a chart drawn in each writer's workspace before it writes
    its notes (as a plotting tool of its own would draw it)."""
    from PIL import Image

    def respond(body: dict[str, Any]) -> Any:
        task = json.dumps(body["messages"][0]["content"])
        # The task's own source line: the last (recalled notes before it may name others).
        child = [None, *re.finditer(r"agent run (\S+) from #([^\]\\]+)\]", task)][-1]
        if CHILD_NOTE in json.dumps(body.get("system") or "") and child is not None \
                and "tool_result" not in json.dumps(body["messages"][-1]["content"]):
            folder = workspaces / f"{child[2]}.writer.{child[1]}"
            folder.mkdir(parents=True, exist_ok=True)
            out = io.BytesIO()
            Image.new("RGB", (48, 24), (30, 120, 200)).save(out, format="PNG")
            (folder / "chart.png").write_bytes(out.getvalue())
        return handback_model(body)
    return respond


async def handback_scenario(keel: KeelClient, settings: KeelSettings,
                            session_id: str) -> SessionHandle:
    session = await keel.start_session(session_id, agent=AgentSpec(
        sub_agents=[SubAgent(name="writer", instructions="You write notes.")]))
    await session.ask("Write the notes.")
    await session.ask("Write them again, and fail.")
    children = (await session.status()).children
    await session.end()
    for child in children:
        history = await keel.session(child.session_id).handle.fetch_history()
        (OUT / f"{child.session_id}.json").write_text(history.to_json())  # named by its id
    return session
