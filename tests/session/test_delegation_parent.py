"""Delegation, from the parent's side: what a parent does reaches the children it started,
and nothing else does. Ending it (mid-wait, or while the model call that starts a child is
out) ends them; a rewind past a delegate call ends that call's child; an imported copy
claims none of them (and a child's own copy or fork answers no parent); its fan-out limit
refuses a call; its person approves a child's call through it; a child spends a share of
its budget and reports what it spent. How an answer comes back is in test_delegation.py;
the team and its fake model are in teams.py. Real Temporal (dev server), real PostgreSQL,
the fake API."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from temporalio.client import WorkflowExecutionStatus

from keel.client import SessionStoppedError
from schemas.agent import CHILD_NOTE
from schemas.budget import BudgetLimits, BudgetSpec
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings
from tests.session.teams import (
    _awaiting_child,
    _closed,
    _last,
    _system,
    rows,
    spec,
    team,
    writing_child,
)


async def test_parent_ended_mid_wait_ends_its_child(
        temporal_env, database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = team(lambda body: tool_use_message(
        [("write_file", {"path": "x.md", "content": "x"})]))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session("team-end", agent=spec(600, child_asks=True))
        accepted = await parent.send("find the answer")
        status = await _awaiting_child(parent)
        [child] = status.children
        await parent.end()
        # The turn ends with the session; once the session has completed, a wait for the
        # turn is answered that the session stopped (the race a loaded machine showed).
        with contextlib.suppress(SessionStoppedError):
            await asyncio.wait_for(parent.wait_reply(accepted.seq), 30)
        assert await _closed(temporal_env.client, "team-end") == \
            WorkflowExecutionStatus.COMPLETED
        assert await _closed(temporal_env.client, child.session_id) == \
            WorkflowExecutionStatus.COMPLETED
        child_status = await keel.session(child.session_id).status()
        assert child_status.ended and "parent session ended" in (
            child_status.stopped_reason or "")


async def test_a_child_started_ahead_whose_call_is_refused_is_ended(
        temporal_env, database_url, fake_anthropic, tmp_path):
    """The parent is ended while its model call is out: the call starts the child of its
    reply, the session refuses the delegate call (it is ending), and that child is ended."""
    import threading

    asked, ended = threading.Event(), threading.Event()

    def respond(body: dict[str, Any]) -> Any:
        if CHILD_NOTE in _system(body):
            return tool_use_message([("write_file", {"path": "x.md", "content": "x"})])
        if "tool_result" in _last(body):
            return text_message("parent done")
        asked.set()
        ended.wait(10)  # the session is ended while this call is out
        return tool_use_message([("delegate", {"agent": "researcher", "task": "look"})])

    fake_anthropic.responder = respond
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session("team-late", agent=spec(600, child_asks=True))
        accepted = await parent.send("find the answer")
        assert await asyncio.to_thread(asked.wait, 20)
        await parent.end()
        ended.set()
        await asyncio.wait_for(parent.wait_reply(accepted.seq), 30)
        assert await _closed(temporal_env.client, "team-late") == \
            WorkflowExecutionStatus.COMPLETED  # its turn ran to its end
        children = [w.id async for w in temporal_env.client.list_workflows(
            "WorkflowId STARTS_WITH 'team-late.'")]
        assert len(children) == 1, children  # started by the model call
        assert (await parent.status()).children == []  # refused: never the session's
        assert await _closed(temporal_env.client, children[0]) == \
            WorkflowExecutionStatus.COMPLETED
    results = [r[2] for r in rows(database_url, "team-late") if r[0] == "tool_result"]
    assert len(results) == 1 and "delegate refused: this session is ending" in results[0]


async def test_fan_out_limit_is_a_tool_error(temporal_env, database_url, fake_anthropic,
                                             tmp_path):
    from schemas.initiative import DelegationLimits

    def respond(body: dict[str, Any]) -> Any:
        if CHILD_NOTE in _system(body):
            # Still working when the second call is weighed: a child started ahead that
            # answered at once was once done by then, and the second was let through.
            time.sleep(2)
            return text_message("child answer")
        if "tool_result" in _last(body) or "agent run" in _last(body):
            return text_message("parent done")
        return tool_use_message([
            ("delegate", {"agent": "researcher", "task": "one", "wait": False}),
            ("delegate", {"agent": "researcher", "task": "two", "wait": False})])

    fake_anthropic.responder = respond
    one_at_a_time = spec().model_copy(update={"delegation": DelegationLimits(max_children=1)})
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session("team-fan", agent=one_at_a_time)
        await asyncio.wait_for(parent.ask("two things at once"), 60)
        assert len((await parent.status()).children) == 1
        await parent.end()
    results = [r[2] for r in rows(database_url, "team-fan") if r[0] == "tool_result"]
    assert results[0].startswith("Started sub-agent researcher")
    assert "refused: 1 sub-agents are working already" in results[1]


async def test_a_childs_approval_is_answered_through_its_parent(
        temporal_env, database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = team(writing_child())
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session("team-approve", agent=spec(60, child_asks=True))
        accepted = await parent.send("write it")
        for _ in range(150):
            tree = await parent.tree_pending()
            if tree:
                break
            await asyncio.sleep(0.2)
        [(holder, call)] = tree
        assert holder.startswith("team-approve.researcher.") and call.tool == "write_file"
        assert await parent.pending() == []  # the parent's own calls: none
        done = await parent.approve(call.call_id, by="lead")  # routed to the child
        assert done.tool == "write_file"
        outcome = await asyncio.wait_for(parent.wait_reply(accepted.seq), 60)
        assert "wrote it" in outcome.reply_text
        await parent.end()


async def test_a_child_spends_a_share_of_its_parents_budget_and_reports_it(
        temporal_env, database_url, fake_anthropic, tmp_path):
    """The child's spec holds half of what the parent had left; its answer carries what it
    spent, which counts against the parent's budget."""
    fake_anthropic.responder = team(lambda body: text_message("done", output_tokens=400))
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    budgeted = spec().model_copy(update={"budget": BudgetSpec(
        session=BudgetLimits(usd=100.0))})
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session("team-budget", agent=budgeted)
        await asyncio.wait_for(parent.ask("find the answer"), 60)
        [child] = (await parent.status()).children
        child_session = keel.session(child.session_id)
        child_status = await child_session.status()
        child_agent = await child_session.agent()
        parent_status = await parent.status()
        await parent.end()
    assert child_agent is not None and child_agent.budget is not None
    assert child_agent.budget.session is not None
    assert 49 < (child_agent.budget.session.usd or 0) <= 50  # half of what was left
    spent = child_status.spent
    assert spent.output_tokens >= 400 and spent.usd > 0
    # The parent's own two calls wrote 5 tokens each: the rest is the child's report.
    assert parent_status.spent.output_tokens >= spent.output_tokens + 10
    assert parent_status.spent.usd > spent.usd


async def test_an_imported_copy_leaves_its_origin_s_running_children_alone(
        temporal_env, database_url, fake_anthropic, tmp_path):
    """A child still working belongs to the session that delegated to it: a copy imported
    beside it does not list it, and ending the copy does not end it."""
    fake_anthropic.responder = team(lambda body: tool_use_message(
        [("write_file", {"path": "x.md", "content": "x"})]), wait=False)
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session("team-copy", agent=spec(600, child_asks=True))
        await asyncio.wait_for(parent.ask("find the answer"), 60)
        [child] = (await parent.status()).children
        assert child.done is None  # it waits on a person's approval
        copy = keel.session((await keel.import_session(
            await keel.export_session("team-copy"), "team-copy-2")).session_id)
        assert (await copy.status()).children == []
        await copy.end()
        assert await _closed(temporal_env.client, "team-copy-2") == \
            WorkflowExecutionStatus.COMPLETED
        await asyncio.sleep(1)
        assert await _closed(temporal_env.client, child.session_id, within_s=0.2) == \
            WorkflowExecutionStatus.RUNNING
        await parent.end()
        assert await _closed(temporal_env.client, child.session_id) == \
            WorkflowExecutionStatus.COMPLETED
        # The child's own bundle goes on as a session of its own: it answers no parent.
        assert (await keel.session(child.session_id).state()).config.delegated is not None
        alone = await keel.import_session(await keel.export_session(child.session_id),
                                          "team-child-alone")
        assert alone.state.config.delegated is None
        assert (await keel.session("team-child-alone").state()).config.delegated is None
        # So does a fork of it: its turn answers the person, and it goes on.
        fork = keel.session((await keel.fork(child.session_id, at_seq=1)).session_id)
        fake_anthropic.responder = lambda body: text_message("the fork answers")
        assert (await asyncio.wait_for(fork.ask("go on"), 60)).reply_text == \
            "the fork answers"
        assert (await fork.state()).config.delegated is None
        assert await _closed(temporal_env.client, fork.session_id, within_s=0.2) == \
            WorkflowExecutionStatus.RUNNING
        await fork.end()


async def test_a_rewind_to_before_a_delegate_call_ends_the_child_it_started(
        temporal_env, database_url, fake_anthropic, tmp_path):
    """Nothing of the abandoned branch is left working: a sub-agent a call after the point
    started is ended, and a notice names it; the parent goes on from the point."""
    fake_anthropic.responder = team(lambda body: tool_use_message(
        [("write_file", {"path": "x.md", "content": "x"})]), wait=False)
    settings = make_settings(database_url, tmp_path, fake_anthropic.base_url)
    async with keel_worker(temporal_env.client, settings) as keel:
        parent = await keel.start_session("team-rewind", agent=spec(600, child_asks=True))
        await asyncio.wait_for(parent.ask("find the answer"), 60)  # #1 to #4
        [child] = (await parent.status()).children
        assert child.done is None and child.seq == 2  # the delegate call's row
        await parent.rewind(1)
        assert await _closed(temporal_env.client, child.session_id) == \
            WorkflowExecutionStatus.COMPLETED
        child_status = await keel.session(child.session_id).status()
        assert child_status.ended and "rewound to #1" in (child_status.stopped_reason or "")
        assert [c.done for c in (await parent.status()).children] == ["ended"]
        await parent.end()
    notices = [r[2] for r in rows(database_url, "team-rewind") if r[0] == "notice"]
    assert any("rewind to #1 ended the sub-agents its abandoned rows started: researcher"
               in n for n in notices), notices
