"""The checkpoint chain against the real SDK, Temporal and PostgreSQL, the model scripted:
each check, the one repair request, each fallback row, and the paths when nothing fits."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from activities.tools import ToolError, workspace_path
from keel.client import session_config
from tests.checkpoint_model import (
    MEMO,
    MIND,
    CheckpointModel,
    CheckpointTurn,
    add_mission,
    edit,
    good_checkpoint,
    now_block,
    tick_all,
)
from tests.fake_anthropic import text_message, tool_use_message
from tests.harness import keel_worker, make_settings

WINDOW, OUTPUT = 12_000, 512
FILLER = " ".join(f"w{i % 97}" for i in range(1_000))  # about 1,900 tokens
FIRST = "ORDER BY created_at LIMIT 1"  # the session's first checkpoint
SHORT_FILLER = " ".join(f"w{i % 97}" for i in range(500))  # about 950 tokens


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def db(database_url: str, sql: str, *args: Any) -> list[tuple]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(sql, args).fetchall()


async def long_session(client, settings, fake, behaviour, *, turns: int = 8,
                       first: str = "Never touch the billing module. " + FILLER,
                       ordinary=None, filler: str = FILLER, **config: Any):
    """Send `turns` large user messages; return the session handle, status and model."""
    model = CheckpointModel(behaviour, **({"ordinary": ordinary} if ordinary else {}))
    fake.responder = model
    cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT, **config)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"c-{uuid.uuid4().hex[:8]}", config=cfg)
        outcomes = [await session.ask(first)]
        for i in range(turns - 1):
            outcomes.append(await session.ask(f"Part {i}: {filler}"))
        status = await session.status()
        mind, memo, now = await session.mind(), await session.memo(), await session.now()
    return session, status, model, outcomes, (mind, memo, now)


async def test_valid_checkpoint_is_stored_and_replaces_the_early_conversation(
        client, settings, fake_anthropic, database_url):
    _session, status, model, outcomes, (mind, memo, now) = await long_session(
        client, settings, fake_anthropic, good_checkpoint)
    assert status.checkpoint_count >= 1
    assert all(o.error is None for o in outcomes)
    assert "- Finish the user's long job" in mind
    assert memo.startswith("#1:\nNever touch the billing module.")  # copied, not retyped
    assert "Current step: keep going" in now
    request = model.checkpoint_requests[0]
    instruction = request["messages"][-1]["content"][-1]["text"]
    assert "This request comes from Keel" in instruction and "not from user" in instruction
    # The checkpoint turn sends the tools, the system prompt and the conversation prefix of
    # the request it interrupts, so it reads them from the prompt cache.
    i = next(i for i, r in enumerate(fake_anthropic.requests) if r is request)
    interrupted = next(r for r in reversed(fake_anthropic.requests[:i])
                       if any(t["name"] == "read_record" for t in r.get("tools", [])))
    assert request["tools"] == interrupted["tools"]
    assert request["system"] == interrupted["system"]
    assert fake_anthropic.usages[i].cache_read > 0
    # The request is never recorded as the user's words.
    assert db(database_url, "SELECT count(*) FROM messages WHERE content_text LIKE %s",
              "%checkpoint request%") == [(0,)]
    # After it, each request starts with the checkpoint, framed as recollection.
    after = fake_anthropic.requests[-1]["messages"][0]["content"][0]["text"]
    assert after.startswith("<recollection>") and "#1:\nNever touch the billing module" in after
    rows = db(database_url, "SELECT kind, fallbacks, cut_seq FROM checkpoints"
              " ORDER BY created_at")
    assert [(k, f) for k, f, _ in rows] == [("model", [])] * status.checkpoint_count
    assert rows[-1][2] == status.window_start_seq


async def test_one_repair_request_names_every_problem(client, settings, fake_anthropic,
                                                      database_url):
    def behaviour(turn: CheckpointTurn) -> dict:
        if not turn.repaired:
            if turn.round == 0:  # a changed preview and a lost Mission-less heading
                line = next(ln for ln in turn.checklist.splitlines() if ln.startswith("- [x]"))
                return tool_use_message([
                    edit(MEMO, line, line + " (edited)"),
                    edit(MIND, "## Lessons", "## Lesson"),
                ])
            return text_message("done, no block")  # no now
        if turn.repair:
            line = next(ln for ln in turn.checklist.splitlines() if ln.startswith("- [x]"))
            return tool_use_message([edit(MEMO, line + " (edited)", line),
                                     edit(MIND, "## Lesson\n", "## Lessons\n")])
        return text_message(now_block())

    _, status, model, _, _ = await long_session(client, settings, fake_anthropic, behaviour)
    repair = [t for req in model.checkpoint_requests for t in
              [b.get("text", "") for b in req["messages"][-1]["content"]]
              if "[Keel: checkpoint repair]" in t]
    text = repair[0]
    assert "3 problem(s)" in text
    assert "[now]" in text and "[mind]" in text and "[memo]" in text
    assert "'## Lessons' was changed to '## Lesson'" in text
    assert "changed beyond its checkbox" in text and "no <checkpoint>" in text
    assert status.checkpoint_count >= 1
    assert db(database_url, "SELECT fallbacks FROM checkpoints " + FIRST) == [([],)]
    attempts = db(database_url, "SELECT repair_sent, outcome FROM checkpoint_attempts"
                  " ORDER BY created_at")
    assert attempts[0] == (True, "stored")
    # One repair request per attempt at most: a repair the window has no room for is not
    # sent (the fallbacks hold), never sent twice.
    assert 1 <= len(repair) <= len(attempts)


async def test_no_usable_now_fails_and_changes_nothing(client, settings, fake_anthropic,
                                                       database_url):
    fake_anthropic.responder = CheckpointModel(lambda turn: text_message("no now from me"))
    step = " ".join(f"w{i % 97}" for i in range(300))  # about 600 tokens: lands under the
    cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT)  # limit
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"c-{uuid.uuid4().hex[:8]}", config=cfg)
        await session.ask("Never touch billing.")
        for i in range(40):
            outcome = await session.ask(f"Part {i}: {step}")
            if db(database_url, "SELECT count(*) FROM checkpoint_attempts")[0][0]:
                break
        status = await session.status()
        mind, memo, now = await session.mind(), await session.memo(), await session.now()
    assert outcome.error is None and outcome.reply_text == "noted"  # still sent as it was
    assert status.checkpoint_count == 0 and status.window_start_seq == 1
    assert (mind, memo, now) == ("", "", "")
    attempts = db(database_url, "SELECT outcome, failure_reason FROM checkpoint_attempts")
    assert attempts == [("failed", attempts[0][1])] and "now" in attempts[0][1]
    assert db(database_url, "SELECT count(*) FROM checkpoints") == [(0,)]


async def test_two_failed_checkpoints_stop_checkpoints_for_the_turn(
        client, settings, fake_anthropic, database_url, tmp_path):
    """One long turn: every call past the threshold, every checkpoint failing. Two are
    tried, then only the move-half path makes room, and the turn still ends."""
    def ordinary(body: dict) -> dict:
        done = sum(1 for m in body["messages"] for b in m["content"]
                   if isinstance(b, dict) and b.get("type") == "tool_result")
        moved = "<recollection>" in str(body["messages"][0]["content"])
        if done < 14 and not (moved and done >= 2):
            return tool_use_message([("read_file", {"path": "chunk.txt"})])
        return text_message("finished reading")

    fake_anthropic.context_window = WINDOW
    model = CheckpointModel(lambda turn: text_message("no now here"), ordinary=ordinary)
    fake_anthropic.responder = model
    session_id = f"c-{uuid.uuid4().hex[:8]}"
    workspace = settings.workspaces_dir / session_id
    workspace.mkdir(parents=True)
    (workspace / "chunk.txt").write_text(" ".join(f"c{i % 89}" for i in range(450)))
    cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT)
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(session_id, config=cfg)
        outcome = await session.ask("Read chunk.txt again and again. " + FILLER)
        status = await session.status()
    assert outcome.error is None and outcome.reply_text == "finished reading"
    assert status.turn == 1
    attempts = db(database_url, "SELECT outcome FROM checkpoint_attempts")
    assert attempts == [("failed",), ("failed",)]  # two, then no more in this turn
    # Too large for a full checkpoint turn, each was sized down to the earlier half first:
    # no request was refused for its size.
    assert not any("too long" in r for r in db(database_url, "SELECT failure_reason FROM"
                                               " checkpoint_attempts")[0])
    kinds = [k for (k,) in db(database_url, "SELECT kind FROM checkpoints")]
    assert kinds and set(kinds) == {"move_half"}


def _fallback_behaviour(mind_change, memo_change=None, final: str | None = None):
    """First turn already broken; the repair changes nothing; so the fallback decides."""
    def behaviour(turn: CheckpointTurn) -> dict:
        if turn.round == 0:
            calls = [mind_change(turn)] if mind_change else []
            calls += memo_change(turn) if memo_change else []
            return tool_use_message(calls) if calls else text_message(final or now_block())
        return text_message(final or now_block())
    return behaviour


async def test_mind_lost_structure_keeps_previous_mind(client, settings, fake_anthropic,
                                                       database_url):
    behaviour = _fallback_behaviour(lambda t: edit(MIND, "## Key decisions", "## Decisions"))
    _, status, _, _, (mind, _, _) = await long_session(client, settings, fake_anthropic,
                                                       behaviour)
    assert status.checkpoint_count >= 1
    assert "## Key decisions" in mind and "## Decisions" not in mind
    fallbacks = db(database_url, "SELECT fallbacks FROM checkpoints " + FIRST)[0][0]
    assert any("previous mind" in f for f in fallbacks)


async def test_section_over_limit_is_cut_with_a_read_only_copy(
        client, settings, fake_anthropic, database_url, tmp_path):
    long_lesson = "- " + " ".join(f"lesson{i}" for i in range(60))  # over 93, under 186

    def mind_change(turn: CheckpointTurn) -> tuple:
        guide = turn.mind.split("## Lessons\n", 1)[1].split("\n", 1)[0]
        return edit(MIND, f"## Lessons\n{guide}", f"## Lessons\n{guide}\n{long_lesson}")

    session, status, _, _, (_mind, _, _) = await long_session(
        client, settings, fake_anthropic, _fallback_behaviour(mind_change))
    assert status.checkpoint_count >= 1
    record_mind, context_mind = db(database_url,
                                   "SELECT mind_text, mind_context_text FROM checkpoints "
                                   + FIRST)[0]
    assert long_lesson in record_mind  # the whole mind stays in the record
    assert long_lesson not in context_mind and ".keel/mind-full-" in context_mind
    copy = next((tmp_path / "workspaces" / session.session_id / ".keel").glob("mind-full-*"))
    assert long_lesson in copy.read_text()
    # Read-only to the agent: it lies in Keel's own folder, which no tool may write.
    with pytest.raises(ToolError, match="read-only"):
        workspace_path(f".keel/{copy.name}", for_write=True)


async def test_memo_changed_beyond_checkboxes_keeps_every_candidate(
        client, settings, fake_anthropic, database_url):
    def memo_change(turn: CheckpointTurn) -> list:
        line = next((ln for ln in turn.checklist.splitlines() if ln.startswith("- [x] #1 ")),
                    None)
        return [edit(MEMO, line, "- [x] #1 the user said to touch billing")] if line else []

    behaviour = _fallback_behaviour(lambda t: add_mission(t.mind, "Do the job"), memo_change)
    _, status, _, _, (_, memo, _) = await long_session(client, settings, fake_anthropic,
                                                       behaviour)
    assert status.checkpoint_count >= 1
    entries, dropped = db(database_url,
                          "SELECT memo, memo_dropped_seqs FROM checkpoints " + FIRST)[0]
    kept = {e["seq"] for e in entries} | set(dropped)
    user_seqs = {r[0] for r in db(database_url, "SELECT seq FROM messages WHERE type='user'"
                                  " AND seq < (SELECT cut_seq FROM checkpoints " + FIRST + ")")}
    assert kept == user_seqs  # more of the user's words, never fewer
    assert "touch billing" not in memo and memo.startswith("#1:\nNever touch the billing")


async def test_rounds_exhausted_keep_every_candidate(client, settings, fake_anthropic,
                                                     database_url):
    def behaviour(turn: CheckpointTurn) -> dict:
        if turn.final_only:
            return text_message(now_block())
        return tool_use_message([("read_file", {"path": MIND})])

    _, status, model, _, _ = await long_session(client, settings, fake_anthropic, behaviour)
    assert status.checkpoint_count >= 1
    first_attempt = [r for r in model.checkpoint_requests][:6]
    assert [r.get("tool_choice") for r in first_attempt][-1] == {"type": "none"}
    assert all(r.get("tool_choice") is None for r in first_attempt[:5])
    entries, dropped = db(database_url,
                          "SELECT memo, memo_dropped_seqs FROM checkpoints " + FIRST)[0]
    user_seqs = {r[0] for r in db(database_url, "SELECT seq FROM messages WHERE type='user'"
                                  " AND seq < (SELECT cut_seq FROM checkpoints " + FIRST + ")")}
    assert {e["seq"] for e in entries} | set(dropped) == user_seqs


async def test_kept_messages_over_budget_are_shortened_evenly(
        client, settings, fake_anthropic, database_url):
    def behaviour(turn: CheckpointTurn) -> dict:
        calls = tick_all(turn.checklist)  # every candidate comes ticked: nothing to do
        if turn.round == 0 and calls:
            return tool_use_message(calls)
        return text_message(now_block())

    _, status, _, _, (_, _memo, _) = await long_session(client, settings, fake_anthropic,
                                                       behaviour)
    assert status.checkpoint_count >= 1
    entries, rendered = db(database_url, "SELECT memo, rendered FROM checkpoints " + FIRST)[0]
    assert len(entries) >= 2 and all(e["cut"] for e in entries)
    originals = dict(db(database_url, "SELECT seq, content_text FROM messages"
                        " WHERE type='user'"))
    for e in entries:
        assert originals[e["seq"]].startswith(e["text"])  # a prefix, byte for byte
        assert f"message #{e['seq']}" in rendered  # the first checkpoint's own memo


async def test_too_large_for_a_checkpoint_turn_takes_the_earlier_half(
        client, settings, fake_anthropic, database_url):
    from tests.fake_anthropic import ErrorStep  # noqa: F401  (documents the API's answer)

    calls = {"n": 0}

    def behaviour(turn: CheckpointTurn) -> dict:
        calls["n"] += 1
        if calls["n"] == 1:
            raise TooLong
        return good_checkpoint(turn)

    class TooLong(Exception):
        pass

    model_holder: dict = {}

    def responder(body: dict) -> dict:
        try:
            return model_holder["m"](body)
        except TooLong:
            return {"__error__": 400}

    # The fake server turns the marker dict into a 400 "prompt is too long".
    import tests.fake_anthropic as fa

    original = fa.FakeAnthropic._next

    def _next(self, body):
        step = original(self, body)
        if isinstance(step, dict) and step.get("__error__"):
            return fa.ErrorStep(400, "invalid_request_error", "prompt is too long")
        return step

    fa.FakeAnthropic._next = _next
    try:
        model = CheckpointModel(behaviour)
        model_holder["m"] = model
        fake_anthropic.responder = responder
        cfg = session_config(settings, context_window=WINDOW, max_output_tokens=OUTPUT)
        async with keel_worker(client, settings) as keel:
            session = await keel.start_session(f"c-{uuid.uuid4().hex[:8]}", config=cfg)
            await session.ask("Never touch the billing module. " + FILLER)
            for i in range(7):
                await session.ask(f"Part {i}: {FILLER}")
            status = await session.status()
    finally:
        fa.FakeAnthropic._next = original
    assert status.checkpoint_count >= 1
    attempts = db(database_url, "SELECT outcome FROM checkpoint_attempts ORDER BY created_at")
    assert attempts[0] == ("failed",) and attempts[1] == ("stored",)
    # The second try saw only the part it condenses.
    cut = db(database_url, "SELECT cut_seq FROM checkpoints ORDER BY created_at")[0][0]
    last = model.checkpoint_requests[1]
    seen = " ".join(b.get("text", "") for m in last["messages"] for b in m["content"]
                    if isinstance(b, dict))
    later = db(database_url, "SELECT content_text FROM messages WHERE type='user' AND seq>=%s",
               cut)
    assert later and all(t[0][:20] not in seen for t in later)
    # Its now saw only the earlier part: it is dated, and the newer messages win.
    now = db(database_url, "SELECT now_text FROM checkpoints " + FIRST)[0][0]
    assert now.startswith(f"(Written over messages up to #{cut - 1} only;")


async def test_checkpoint_carries_skills_as_they_read_now_and_recent_files(
        client, settings, fake_anthropic, database_url):
    skill_dir = settings.skills_dir / "house-style"
    skill_dir.mkdir(parents=True)
    (skill_dir / "SKILL.md").write_text("---\nname: house-style\ndescription: how we write\n"
                                        "---\nWrite short sentences. Version one.\n")
    turns = {"n": 0}

    def ordinary(body: dict) -> dict:
        last = body["messages"][-1]["content"]
        if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in last):
            return text_message("done")
        turns["n"] += 1
        if turns["n"] == 1:
            return tool_use_message([("load_skill", {"name": "house-style"}),
                                     ("write_file", {"path": "a.txt", "content": "a"}),
                                     ("read_file", {"path": "a.txt"})])
        return text_message("noted")

    def behaviour(turn: CheckpointTurn) -> dict:
        # The skill changed since it was loaded: the checkpoint carries it as it reads now.
        (skill_dir / "SKILL.md").write_text(
            "---\nname: house-style\ndescription: how we write\n---\n"
            "Write short sentences. Version two.\n")
        return good_checkpoint(turn)

    await long_session(client, settings, fake_anthropic, behaviour, ordinary=ordinary)
    rendered = db(database_url, "SELECT rendered FROM checkpoints " + FIRST)[0][0]
    assert "Version two." in rendered and "Version one." not in rendered
    assert "house-style" in rendered
    files = rendered.split("Modified:", 1)[1]
    assert "a.txt" in files.split("\n", 1)[0] and "a.txt" in files.split("Read:", 1)[1]
    # A carried skill is not a new load: the record holds a single load_skill result.
    loads = db(database_url, "SELECT count(*) FROM messages WHERE type='tool_result'"
               " AND content->>'skill' = 'house-style'")
    assert loads == [(1,)]
