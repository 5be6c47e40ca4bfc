"""Delegation, the way back: a parent's `delegate` call starts a child session whose answer
(or failure, or timeout) comes back as an agent-run input with Keel's source line. An
answer, a failure, a timeout, a child ended without an answer, one that outgrows its
window, one whose answer is heard before its call was known, one whose parent runs older
code, one whose worker is killed mid-wait: each reaches the waiting parent once; a waiting
round trip costs one workflow task from the answer to the next model call. What a parent's
own acts do to its children is in test_delegation_parent.py; the team and its fake model
are in teams.py. Real Temporal (dev server), real PostgreSQL, the fake API."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from keel.client import session_config
from schemas.agent import CHILD_NOTE
from tests.checkpoint_model import CheckpointModel, good_checkpoint
from tests.fake_anthropic import ErrorStep, text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.session.teams import _awaiting_child, _closed, _last, _system, rows, spec, team


async def test_child_answers_and_the_waiting_turn_reads_it(
        temporal_env, database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = team(lambda body: text_message("the answer is 42"))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session("team-ok", agent=spec())
        seen: list[str] = []

        async def read() -> None:
            async for _, event in parent.events():
                seen.append(event.type)

        reader = asyncio.create_task(read())
        outcome = await asyncio.wait_for(parent.ask("find the answer"), 60)
        assert "parent done" in outcome.reply_text and "42" in outcome.reply_text
        status = await parent.status()
        [child] = status.children
        assert child.done == "answered" and child.agent == "researcher"
        assert await _closed(temporal_env.client, child.session_id) == \
            WorkflowExecutionStatus.COMPLETED
        child_status = await keel.session(child.session_id).status()
        assert child_status.parent_session == "team-ok" and child_status.ended
        listed = {s.session_id: s.parent for s in await keel.list_sessions()}
        assert listed.get(child.session_id) == "team-ok"
        from keel.cli.sessions import session_tree

        tree = [(s.session_id, depth) for s, depth in session_tree(await keel.list_sessions())]
        at = tree.index(("team-ok", 0))
        assert tree[at + 1] == (child.session_id, 1)  # `keel list` shows it under its parent
        # The UI links parent and child both ways.
        import httpx2 as httpx

        from keel.ui.server import ui_server

        async with (ui_server(keel, settings, database_url, port=0) as url,
                    httpx.AsyncClient(timeout=20) as http):
            base = url.removesuffix("/sessions")
            page = (await http.get(f"{base}/sessions/team-ok")).text
            assert f'href="/sessions/{child.session_id}"' in page
            page = (await http.get(f"{base}/sessions/{child.session_id}")).text
            assert 'id="parent-link" href="/sessions/team-ok"' in page
        await parent.end()
        await asyncio.wait_for(reader, 20)
    answer = [r for r in rows(database_url, "team-ok") if r[0] == "harness"
              and (r[1] or "").startswith("[Harness: agent run ")]
    assert len(answer) == 1 and answer[0][2] == "the answer is 42"
    assert answer[0][1].endswith(f"from #{child.session_id}]")
    # The child's first input is the task, in the parent's voice, never a user's.
    first = rows(database_url, child.session_id)[0]
    assert first[0] == "harness" and first[1].endswith("from #team-ok]")
    assert "child_started" in seen and "child_answered" in seen


async def test_child_that_fails_says_so(temporal_env, database_url, fake_anthropic,
                                        tmp_path):
    fake_anthropic.responder = team(lambda body: ErrorStep(400, message="bad request"))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session("team-fail", agent=spec())
        outcome = await asyncio.wait_for(parent.ask("find the answer"), 60)
        [child] = (await parent.status()).children
        assert child.done == "failed"
        assert "failed" in outcome.reply_text
        await parent.end()
    answer = [r for r in rows(database_url, "team-fail")
              if (r[1] or "").startswith("[Harness: agent run ")]
    assert len(answer) == 1 and "Sub-agent researcher failed" in answer[0][2]


async def test_child_that_outlives_its_timeout_is_ended(
        temporal_env, database_url, fake_anthropic, tmp_path):
    # The child waits on a person who never answers: it outlives its two seconds.
    fake_anthropic.responder = team(lambda body: tool_use_message(
        [("write_file", {"path": "x.md", "content": "x"})]))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session("team-slow", agent=spec(2, child_asks=True))
        outcome = await asyncio.wait_for(parent.ask("find the answer"), 60)
        assert "timed out" in outcome.reply_text
        [child] = (await parent.status()).children
        assert child.done == "timed out"
        assert await _closed(temporal_env.client, child.session_id) == \
            WorkflowExecutionStatus.COMPLETED
        await parent.end()
    timeout = [r for r in rows(database_url, "team-slow")
               if (r[1] or "").startswith("[Harness: agent run ")]
    assert len(timeout) == 1 and "did not answer within 2 s; it was ended" in timeout[0][2]


FILLER = " ".join(f"note{i % 89}" for i in range(900))  # about 1,800 tokens


async def test_a_child_that_outgrows_its_window_checkpoints_and_still_answers(
        temporal_env, database_url, fake_anthropic, tmp_path):
    """The child's work (notes written at length, a round at a time) outgrows its 12k
    window mid-task: it takes a checkpoint, goes on from its condensed window, and its
    answer reaches the waiting parent as any child's does."""
    calls = itertools.count()

    def child(body: dict[str, Any]) -> Any:
        n = next(calls)  # the child's ordinary calls (its checkpoint turn is answered apart)
        if n < 8:
            return tool_use_message([("write_file", {"path": f"notes{n}.md",
                                                     "content": FILLER})])
        return text_message("the answer is 42, from the notes")

    fake_anthropic.responder = CheckpointModel(good_checkpoint, ordinary=team(child))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session("team-cp", agent=spec(), config=session_config(
            settings, context_window=12_000, max_output_tokens=512))
        outcome = await asyncio.wait_for(parent.ask("find the answer"), 120)
        assert "parent done" in outcome.reply_text and "42" in outcome.reply_text
        [child_run] = (await parent.status()).children
        assert child_run.done == "answered"
        child_status = await keel.session(child_run.session_id).status()
        assert child_status.checkpoint_count >= 1 and child_status.ended
        assert (await parent.status()).checkpoint_count == 0  # the work was the child's
        from activities.workspace import LocalStore

        written = [f.path for f in await LocalStore.of(settings).list(child_run.session_id)
                   if not f.path.startswith(".keel/")]
        await parent.end()
    answer = [r for r in rows(database_url, "team-cp")
              if (r[1] or "").startswith("[Harness: agent run ")]
    assert len(answer) == 1
    words, line = answer[0][2].split("\n\n")
    assert words == "the answer is 42, from the notes"
    # The notes it wrote came home with it (activities.handback), every one it has.
    assert line == ("[Keel: the files it wrote are in your workspace: "
                    f"{', '.join(sorted(written))}]")
    # The task is the child's first input, in the parent's voice, kept past its checkpoint.
    first = rows(database_url, child_run.session_id)[0]
    assert first[0] == "harness" and first[1].endswith("from #team-cp]")


async def test_worker_killed_mid_delegation_starts_one_child(
        temporal_env, database_url, fake_anthropic, tmp_path):
    """SIGKILL the worker while the parent's delegate call waits and the child works: after
    the restart the call finds the child it started (one child, one answer)."""
    import os
    import signal
    import time

    from keel.client import KeelClient
    from schemas.config import KeelSettings
    from tests.harness import stop_process
    from tests.session.worker_process import start_worker

    def slow_child(body: dict[str, Any]) -> Any:
        time.sleep(1.5)  # long enough to kill the worker while the child's call is open
        return text_message("slow answer")

    fake_anthropic.responder = team(slow_child)
    queue = "team-crash"
    env = {**os.environ, "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": queue,
           "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
           "KEEL_DATA_DIR": str(tmp_path), "ANTHROPIC_BASE_URL": fake_anthropic.base_url,
           "ANTHROPIC_API_KEY": "test"}
    keel = KeelClient(temporal_env.client, queue, KeelSettings.from_env(env))
    worker = start_worker(env)
    try:
        parent = await keel.start_session("team-crash", agent=spec())
        accepted = await parent.send("find it slowly")
        await _awaiting_child(parent)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        worker = start_worker(env)
        outcome = await asyncio.wait_for(parent.wait_reply(accepted.seq), 90)
        assert "slow answer" in outcome.reply_text
        children = [w.id async for w in temporal_env.client.list_workflows(
            "WorkflowId STARTS_WITH 'team-crash.'")]
        assert len(set(children)) == 1, children
        await parent.end()
    finally:
        stop_process(worker)
    answers = [r for r in rows(database_url, "team-crash")
               if (r[1] or "").startswith("[Harness: agent run ")]
    assert len(answers) == 1 and answers[0][2] == "slow answer"


def _kinds(events: Any) -> list[str]:
    from temporalio.api.enums.v1 import EventType

    out = []
    for e in events:
        name = EventType.Name(e.event_type).removeprefix("EVENT_TYPE_")
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name += ":" + e.activity_task_scheduled_event_attributes.activity_type.name
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            name += ":" + e.workflow_execution_signaled_event_attributes.signal_name
        out.append(name)
    return out


async def test_a_waiting_round_trip_is_one_task_from_the_answer_to_the_next_call(
        temporal_env, database_url, fake_anthropic, tmp_path):
    """The parent's model call starts the child of its reply's waiting call itself (no child
    workflow start in the parent's history), the child's final model call tells the parent
    its answer (no signal from the child's workflow), and the call's result is written by
    the parent's next model call, in order after the answer."""
    fake_anthropic.responder = team(lambda body: text_message("the answer is 42"))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session("team-fast", agent=spec())
        outcome = await asyncio.wait_for(parent.ask("find the answer"), 60)
        assert "42" in outcome.reply_text
        [child] = (await parent.status()).children
        assert child.done == "answered" and child.ahead
        events = _kinds((await parent.handle.fetch_history()).events)
        child_events = _kinds((await temporal_env.client.get_workflow_handle(
            child.session_id).fetch_history()).events)
        child_status = await keel.session(child.session_id).status()
        await parent.end()
    assert child_status.ended and child_status.parent_session == "team-fast"
    assert "START_CHILD_WORKFLOW_EXECUTION_INITIATED" not in events
    assert "ACTIVITY_TASK_SCHEDULED:record_tool_result" not in events
    assert "WORKFLOW_EXECUTION_SIGNALED:agent_run" not in events
    assert "SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED" not in child_events
    # The child's whole run: one model call between its two workflow tasks.
    assert child_events.count("WORKFLOW_TASK_COMPLETED") == 2, child_events
    # From the child's answer to the parent's next model call: one workflow task.
    told = events.index("WORKFLOW_EXECUTION_SIGNALED:child_answer")
    after = events[told:events.index("ACTIVITY_TASK_SCHEDULED:call_model", told)]
    assert after.count("WORKFLOW_TASK_COMPLETED") == 1, after
    assert events.count("ACTIVITY_TASK_SCHEDULED:call_model") == 2
    kinds = [(r[0], (r[1] or "")[:24]) for r in rows(database_url, "team-fast")
             if r[0] != "notice"]  # the end's
    assert kinds[-3:] == [("harness", "[Harness: agent run tool"), ("tool_result", ""),
                          ("assistant", "")]
    # The model read the answer and the call's result, in that order.
    last = fake_anthropic.requests[-1]["messages"][-1]["content"]
    assert [b["type"] for b in last] == ["tool_result", "text"]
    assert "the answer is 42" in last[1]["text"] and "answered" in last[0]["content"]


@pytest.mark.parametrize("ahead", [True, False], ids=["started-ahead", "temporal-child"])
async def test_a_child_that_ends_without_an_answer_is_a_failure_at_once(
        temporal_env, database_url, fake_anthropic, tmp_path, ahead):
    """A child terminated while its parent waits: the parent hears it ended without an
    answer at once (a Temporal child, from its completion), or within seconds (a child its
    model call started, asked after 2 s), never at the child's timeout. A reply with two
    calls has its child started by the workflow, as a Temporal child."""
    def respond(body: dict[str, Any]) -> Any:
        if CHILD_NOTE in _system(body):
            return tool_use_message([("write_file", {"path": "x.md", "content": "x"})])
        last = _last(body)
        if "agent run" in last or "tool_result" in last:
            return text_message("parent done: " + last[-400:])
        calls: list[tuple[str, dict[str, Any]]] = [
            ("delegate", {"agent": "researcher", "task": "look it up"})]
        return tool_use_message(calls if ahead else [
            *calls, ("read_file", {"path": "notes.md"})])

    fake_anthropic.responder = respond
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    name = f"team-gone-{'ahead' if ahead else 'child'}"
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session(name, agent=spec(600, child_asks=True))
        accepted = await parent.send("find the answer")
        status = await _awaiting_child(parent)
        [child] = status.children
        assert child.ahead is ahead
        await temporal_env.client.get_workflow_handle(child.session_id).terminate("gone")
        outcome = await asyncio.wait_for(parent.wait_reply(accepted.seq), 30)
        assert "without an answer" in outcome.reply_text
        [child] = (await parent.status()).children
        assert child.done == "failed"
        await parent.end()
    answer = [r for r in rows(database_url, name)
              if (r[1] or "").startswith("[Harness: agent run ")]
    assert len(answer) == 1 and "ended without an answer" in answer[0][2]


async def test_an_answer_heard_before_its_childs_call_was_known_is_taken_at_once(
        temporal_env, database_url, fake_anthropic, tmp_path):
    """The child's model call could not tell its parent (that signal failed), so the child
    answered at its end; the parent heard it while the model call that had started the
    child was out again (its first completion lost, retried after the child ended). The
    retried call finds its child, and the delegate call takes the answer heard before:
    at once, not at the child's timeout (600 s), and recorded once."""
    from keel.client import KeelClient
    from tests.faults import DelegationFaults
    from workers.worker import build_worker

    faults = DelegationFaults(armed=lambda: True)
    lost = faults.lost
    fake_anthropic.responder = team(lambda body: text_message("early answer"))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with build_worker(faults.client(temporal_env.client), settings,
                            interceptors=[faults]):
        keel = KeelClient(temporal_env.client, settings.task_queue, settings)
        parent = await keel.start_session("team-early", agent=spec(600))
        outcome = await asyncio.wait_for(parent.ask("find it"), 60)
        assert lost, "the model call's completion was not lost: nothing was tested"
        assert await _closed(temporal_env.client, lost[0]) == \
            WorkflowExecutionStatus.COMPLETED
        assert "early answer" in outcome.reply_text
        [child] = (await parent.status()).children
        assert child.session_id == lost[0] and child.ahead and child.done == "answered"
        await parent.end()
    answers = [r for r in rows(database_url, "team-early")
               if (r[1] or "").startswith("[Harness: agent run ")]
    assert len(answers) == 1 and answers[0][2] == "early answer"


async def test_a_child_of_a_parent_on_older_code_answers_at_its_end(
        temporal_env, database_url, fake_anthropic, tmp_path):
    """Mid rolling deploy a parent on code from before `child_answer` starts a child that
    runs on newer code. Its start input says nothing of that signal (`hears_call`), so the
    child's model call does not use it (the parent would take it for an unknown signal,
    record a notice, and wait out the child's timeout): it answers at its end, by the
    agent-run signal every version hears."""
    from schemas.delegation import child_input
    from schemas.messages import ToolCall
    from schemas.session import SESSION_WORKFLOW, Handler
    from tests.harness import small_config

    fake_anthropic.responder = team(lambda body: text_message("answer for an old parent"))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session("team-old", agent=spec())
        call = ToolCall(id="toolu_old_1", name="delegate",
                        input={"agent": "researcher", "task": "look it up"})
        start = child_input("team-old", small_config(settings, agent=spec()), call,
                            (await parent.status()).spent, answer_in_result=False)
        assert start.config.delegated is not None and start.config.delegated.hears_call
        start.config.delegated.hears_call = False  # as an older parent's start input
        await temporal_env.client.start_workflow(
            SESSION_WORKFLOW, start, id=start.session_id, task_queue=settings.task_queue)
        assert await _closed(temporal_env.client, start.session_id, within_s=60) == \
            WorkflowExecutionStatus.COMPLETED
        history = await temporal_env.client.get_workflow_handle("team-old").fetch_history()
        # Keel's own signals (a model call that streams long enough also publishes its
        # text to the event stream by the SDK's `__temporal_...` signal: not an answer).
        signals = [e.workflow_execution_signaled_event_attributes.signal_name
                   for e in history.events
                   if e.HasField("workflow_execution_signaled_event_attributes")
                   and not e.workflow_execution_signaled_event_attributes.signal_name
                   .startswith("__temporal")]
        assert signals == [Handler.AGENT_RUN], signals
        await parent.end()
    answers = [r for r in rows(database_url, "team-old")
               if (r[1] or "").startswith("[Harness: agent run ")]
    assert [a[2] for a in answers] == ["answer for an old parent"]


async def test_a_delegate_calls_files_go_with_the_task_and_a_missing_one_refuses_it(
        temporal_env, database_url, fake_anthropic, tmp_path):
    import base64

    from schemas.attachments import upload_path
    from tests.attached import image

    shot = image(96, 64)
    shared = upload_path("shot.png", shot)
    seen: list[list[str]] = []

    def respond(body: dict[str, Any]) -> Any:
        if CHILD_NOTE in _system(body):
            first = body["messages"][0]["content"]
            seen.append([b["type"] for b in first])
            data = next(b["source"]["data"] for b in first if b["type"] == "image")
            return text_message("a red rectangle" if base64.b64decode(data) == shot
                                else "another image")
        last = _last(body)
        if "agent run" in last or "tool_result" in last:
            return text_message("parent done: " + last[-400:])
        files = [shared] if "this one" in last else ["no/such.png"]
        return tool_use_message([("delegate", {"agent": "researcher", "task": "describe it",
                                               "files": files})])

    fake_anthropic.responder = respond
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session(f"team-files-{uuid.uuid4().hex[:6]}", agent=spec())
        outcome = await asyncio.wait_for(
            parent.ask("look at this one", attachments=[("shot.png", shot)]), 60)
        [child] = (await parent.status()).children
        refused = await asyncio.wait_for(parent.ask("and the other"), 60)
        assert len((await parent.status()).children) == 1  # the refused call started none
        await parent.end()
    assert "a red rectangle" in outcome.reply_text
    assert seen == [["image", "text"]]  # the child's task: the file, then its words
    import psycopg

    with psycopg.connect(database_url) as conn:
        task = conn.execute("SELECT content FROM messages WHERE session_id = %s AND seq = 1",
                            (child.session_id,)).fetchone()
    assert task is not None
    [kept] = task[0]["attachments"]
    assert kept["path"] == shared and base64.b64decode(kept["data"]) == shot
    assert "delegate refused: there is no file at no/such.png in your workspace" in \
        refused.reply_text
