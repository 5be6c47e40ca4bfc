"""`keel chat` asks its person what a turn waits on (keel.cli.asking): each tool call's
approval, a sub-agent's too, and a reached budget, answered in place and sent bound to the
call shown; a question answered elsewhere or ended by Ctrl-C is taken back; input that
ends while a question is up leaves the chat and the call pending. Before, the chat sat
silent on "approval needed" until another terminal answered. Real Temporal, real
PostgreSQL, the fake API; the chat as a command (piped) and on a pseudo-terminal."""

from __future__ import annotations

import asyncio
import time
import uuid

import psycopg
import pytest

from keel.client import session_config
from schemas.agent import AgentSpec, ApprovalPolicy, ApprovalRules
from schemas.budget import BudgetLimits, BudgetSpec
from tests.command_line import Pty, cli_env, keel, keel_chat  # noqa: F401 (a fixture)
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings, until
from tests.session.budgets import BIG_INPUT, WRITE, paused_child
from tests.session.teams import _last, spec, team, writing_child

ASKS = AgentSpec(approvals=ApprovalRules(tools={"write_file": ApprovalPolicy.ASK}))


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


@pytest.fixture
def env(cli_env):  # noqa: F811
    return {**cli_env, "USER": "tester"}


def _rows(database_url: str, sid: str) -> list[tuple[str, str]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute("SELECT type, content_text FROM messages WHERE session_id = %s"
                            " ORDER BY seq", (sid,)).fetchall()


def _two_writes(fake_anthropic) -> None:
    fake_anthropic.push(
        tool_use_message([("write_file", {"path": "a.md", "content": "first"})]),
        tool_use_message([("write_file", {"path": "b.md", "content": "second"})]),
        text_message("Both asked about."))


async def test_the_chat_asks_for_each_approval_and_sends_the_answer(
        client, settings, env, fake_anthropic, database_url):
    _two_writes(fake_anthropic)
    sid = f"ask-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as k:
        await k.start_session(sid, agent=ASKS)
        out = await keel(env, "chat", sid,
                         input="Write two notes.\nmaybe\ny\nn not that one\n/quit\n")
        assert await k.session(sid).pending() == []
        assert (await k.session(sid).read_file("a.md")).data == b"first"
        assert not [f for f in await k.session(sid).list_files() if f.path == "b.md"]
    said = " ".join(out.split())
    assert 'approve write_file {"path": "a.md", "content": "first"}? y / n' in said
    assert "y or n, please (that line was not sent to the session)" in said
    assert "approved write_file" in said and "approved by tester" in said
    assert "denied write_file" in said and "denied by tester" in said
    assert "keel: Both asked about." in said
    rows = _rows(database_url, sid)
    assert [text for kind, text in rows if kind == "user"] == ["Write two notes."]
    results = [text for kind, text in rows if kind == "tool_result"]
    assert "not that one" in results[-1] and "not that one" not in results[0]


async def test_the_chat_asks_to_raise_a_reached_budget(client, settings, env,
                                                      fake_anthropic):
    spec_ = AgentSpec(budget=BudgetSpec(session=BudgetLimits(usd=0.2)))
    fake_anthropic.push(tool_use_message([WRITE], input_tokens=BIG_INPUT),
                        text_message("Finished after the raise."),
                        tool_use_message([WRITE], input_tokens=BIG_INPUT))
    async with keel_worker(client, settings) as k:
        raised = (await k.start_session(f"b-{uuid.uuid4().hex[:8]}", agent=spec_)).session_id
        out = await keel(env, "chat", raised, input="Write the notes.\ny\n/quit\n")
        said = " ".join(out.split())
        # $0.3003 spent of $0.20: as much again lets it spend another $0.20.
        assert ("the session's budget is reached ($0.3003 of $0.2000): allow $0.2000 more?"
                in said)
        assert "budget raised by tester" in said and "keel: Finished after the raise." in said
        status = await k.session(raised).status()
        assert status.budget_request is None and status.phase.value == "idle"

        refused = (await k.start_session(f"b-{uuid.uuid4().hex[:8]}", agent=spec_)).session_id
        out = await keel(env, "chat", refused, input="Write them again.\nn too much\n/quit\n")
        said = " ".join(out.split())
        assert "budget not raised by tester" in said
        assert "a raise was refused" in said


async def test_a_sub_agent_s_approval_is_asked_in_its_parent_s_chat(
        client, settings, env, fake_anthropic):
    fake_anthropic.responder = team(writing_child())
    sid = f"team-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as k:
        await k.start_session(sid, agent=spec(60, child_asks=True))
        out = await keel(env, "chat", sid, input="write it\ny\n/quit\n")
        await k.session(sid).end()
    said = " ".join(out.split())
    assert f"sub-agent {sid}.researcher." in said
    assert 'approve write_file {"path": "x.md", "content": "x"}?' in said
    assert "approved write_file" in said and "wrote it" in said


async def test_input_ending_at_a_question_leaves_the_chat_and_the_call_pending(
        client, settings, env, fake_anthropic):
    _two_writes(fake_anthropic)
    sid = f"eof-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as k:
        await k.start_session(sid, agent=ASKS)
        out = await asyncio.wait_for(keel(env, "chat", sid, input="Write two notes.\n"), 60)
        [waiting] = await k.session(sid).pending()
        await k.session(sid).end()
    said = " ".join(out.split())
    assert f"no answer read; the turn waits (`keel pending {sid}`" in said
    assert f"left {sid}; it keeps running." in said
    assert waiting.tool == "write_file" and waiting.input["path"] == "a.md"


async def test_a_question_answered_elsewhere_is_taken_back_and_ctrl_c_ends_the_wait(
        client, settings, env, fake_anthropic):
    _two_writes(fake_anthropic)
    sid = f"pty-ask-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as k:
        await k.start_session(sid, agent=ASKS)
        chat = keel_chat(env, sid)
        try:
            await chat.expect("you")
            chat.send("Write two notes.\r")
            await chat.expect("answer:")
            [first] = await k.session(sid).pending()
            await k.session(sid).approve(first.call_id, by="ops")
            screen = await chat.expect("approved by ops")
            after = screen.index("approved by ops")
            screen = await chat.expect("answer:", since=after)  # the second call's
            between = screen[after:screen.index("answer:", after)]
            assert '"b.md"' in between  # taken back: no prompt left over before it
            chat.send("\x03")  # Ctrl-C at the question: the turn is interrupted
            screen = await chat.expect("you:", since=screen.index("answer:", after))
            assert "denied by" in screen[after:]
            chat.send("/quit\r")
            await chat.expect(f"left {sid}")
        finally:
            chat.close()
        assert await k.session(sid).pending() == []
        assert not [f for f in await k.session(sid).list_files() if f.path == "b.md"]


async def test_a_line_typed_before_a_question_is_kept_as_the_next_message_not_its_answer(
        client, settings, env, fake_anthropic, database_url):
    """On a terminal, a line typed while the model is still thinking was meant for the
    session: the approval question that then shows does not take it as its answer (before,
    it did, and the line was lost), and the chat sends it once the turn is over."""
    def respond(body: dict) -> dict:
        said = str(body["messages"])
        if "Also check the spelling." in said:
            return text_message("Checked.")
        if "tool_result" in said:
            return text_message("Written.")
        time.sleep(2)  # thinking: the person types meanwhile
        return tool_use_message([("write_file", {"path": "a.md", "content": "first"})])

    fake_anthropic.responder = respond
    sid = f"ahead-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as k:
        await k.start_session(sid, agent=ASKS)
        chat = keel_chat(env, sid)
        try:
            await chat.expect("you")
            chat.send("Write a note.\r")

            async def thinking() -> bool:
                return len(fake_anthropic.requests) >= 1
            await until(thinking)
            chat.send("Also check the spelling.\r")
            screen = await chat.expect("answer:")
            assert "kept for after this turn (typed before the question): Also check the " \
                   "spelling." in " ".join(screen.split())
            chat.send("y\r")
            await chat.expect("Checked.")
            chat.send("/quit\r")
            await chat.expect(f"left {sid}")
        finally:
            chat.close()
        assert (await k.session(sid).read_file("a.md")).data == b"first"
    assert [text for kind, text in _rows(database_url, sid) if kind == "user"] == [
        "Write a note.", "Also check the spelling."]


async def test_a_chat_joining_a_waiting_session_says_so_and_pending_asks(
        client, settings, env, fake_anthropic):
    """A turn started elsewhere (here by the client) waits on an approval: the chat that
    joins says so, /pending asks, and a /pending with nothing waiting says that."""
    fake_anthropic.push(
        tool_use_message([("write_file", {"path": "a.md", "content": "first"})]),
        text_message("Written."))
    sid = f"join-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as k:
        session = await k.start_session(sid, agent=ASKS)
        accepted = await session.send("Write a note.")
        await until(session.pending)
        out = await keel(env, "chat", sid, input="/pending\ny\n/pending\n/quit\n")
        outcome = await asyncio.wait_for(session.wait_reply(accepted.seq), 30)
    said = " ".join(out.split())
    assert "the session waits on you (1 question): /pending asks" in said
    assert 'approve write_file {"path": "a.md", "content": "first"}?' in said
    assert "approved write_file" in said and "nothing waits on you" in said
    assert outcome.reply_text == "Written."


async def test_a_background_turn_s_approval_at_the_prompt_is_answered_with_pending(
        client, settings, env, fake_anthropic):
    """The person is idle at the prompt when a Watch's turn asks for an approval: the chat
    says /pending asks, and /pending does."""
    fake_anthropic.push(
        text_message("Hello."),
        tool_use_message([("write_file", {"path": "w.md", "content": "watched"})]),
        text_message("Noted the build."))
    sid = f"pty-bg-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as k:
        await k.start_session(sid, agent=ASKS)
        chat = keel_chat(env, sid)
        try:
            await chat.expect("you")
            chat.send("Hi.\r")
            screen = await chat.expect("Hello.")
            await k.session(sid).watch("ci-1", "CI", "The build is red.")
            screen = await chat.expect("/pending asks what waits on you", since=len(screen))
            chat.send("/pending\r")
            screen = await chat.expect("answer:", since=screen.rindex("/pending asks"))
            chat.send("y\r")
            await chat.expect("Noted the build.", since=screen.rindex("answer:"))
            chat.send("/quit\r")
            await chat.expect(f"left {sid}")
        finally:
            chat.close()
        assert (await k.session(sid).read_file("w.md")).data == b"watched"


async def test_send_wait_says_how_to_answer_what_its_turn_waits_on(
        client, settings, env, fake_anthropic):
    """`keel send --wait` cannot ask; its line says the command that answers, with the
    session's id and the call's (the budget's said `keel budget SESSION` as a placeholder)."""
    fake_anthropic.push(
        tool_use_message([("write_file", {"path": "a.md", "content": "first"})]),
        text_message("Written."))
    sid = f"send-{uuid.uuid4().hex[:8]}"
    async with keel_worker(client, settings) as k:
        session = await k.start_session(sid, agent=ASKS)
        sending = asyncio.ensure_future(keel(env, "send", sid, "--wait", "Write a note."))
        waiting = await until(session.pending)
        await session.approve(waiting[0].call_id, by="ops")
        out = await asyncio.wait_for(sending, 30)
    said = " ".join(out.split())
    assert f"the turn waits: keel approve {sid} {waiting[0].call_id}, or keel deny" in said
    assert "keel: Written." in said


async def test_a_sub_agent_s_reached_budget_is_asked_in_its_parent_s_chat(
        client, settings, env, fake_anthropic):
    """A sub-agent's budget (its share of what the parent had left) is reached: the parent
    waits on it, and its chat asks about it as about the parent's own, where before
    nothing in the parent's chat or `keel budget` said what it waited on."""
    def child(body):
        if "tool_result" in _last(body):
            return text_message("researched")
        return tool_use_message([WRITE], input_tokens=BIG_INPUT)  # $0.30 of its $0.10

    fake_anthropic.responder = team(child)
    sid = f"team-b-{uuid.uuid4().hex[:8]}"
    budgeted = spec().model_copy(update={"budget": BudgetSpec(
        session=BudgetLimits(usd=0.2))})
    async with keel_worker(client, settings) as k:
        # From outside: `keel budget PARENT` names the paused child and its command.
        alone = session_config(settings, memory_scope=None)  # no recall of each other
        again = await k.start_session(f"{sid}-2", alone, agent=budgeted)
        await again.send("find it")
        paused_one, _ = await paused_child(again)
        shown = " ".join((await keel(env, "budget", again.session_id)).split())
        # In a chat: the child's pause, then the parent's own (the child's spend counts).
        await k.start_session(sid, alone, agent=budgeted)
        out = await keel(env, "chat", sid, input="find it\ny\ny\n/quit\n")
        [child_run] = (await k.session(sid).status()).children
        child_status = await k.session(child_run.session_id).status()
        await k.session(sid).end()
        await again.end()
    said = " ".join(out.split())
    assert f"sub-agent {child_run.session_id}: the session's budget is reached" in said
    assert said.count("the session's budget raised: $") == 2
    assert "parent done:" in said and "researched" in said
    assert child_status.budget_request is None and child_status.spent.usd > 0.3
    child_id = paused_one.session_id
    assert (f"sub-agent {child_id} paused: its session's budget is reached ($0.3003 of $"
            in shown and f"keel budget {child_id} --again, --raise AMOUNT or --refuse" in shown)


async def test_a_refused_answer_is_said_and_asked_again(client, settings, env,
                                                       fake_anthropic):
    """A denial's note over the session's bound is refused, saying so, and the question
    comes again (it was taken as asked, and the chat waited on a call nobody answered)."""
    fake_anthropic.push(
        tool_use_message([("write_file", {"path": "a.md", "content": "first"})]),
        text_message("Fine."))
    sid = f"note-{uuid.uuid4().hex[:8]}"
    long_note = "n " + "x" * 5_000
    async with keel_worker(client, settings) as k:
        await k.start_session(sid, agent=ASKS)
        out = await asyncio.wait_for(keel(
            env, "chat", sid, input=f"Write a note.\n{long_note}\nn too long, sorry\n/quit\n"),
            60)
    said = " ".join(out.split())
    assert "the decision's note has 5000 characters; the limit is 4000" in said
    assert said.count("approve write_file") == 2
    assert "denied write_file" in said and "keel: Fine." in said
