"""The rollup chain over simulated weeks on the time-skipping server, the model scripted by
the fake Messages API (answering by the offline rollup rules); catch-up; the offline rules."""

import dataclasses
import json
import shutil
import uuid
from datetime import UTC, date, datetime, timedelta

from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from activities.offline import rollup as offline_rollup
from activities.vault.rollup import RollupActivities, RollupPeriodsInput
from schemas.config import ModelSettings
from schemas.tokens import count_tokens
from schemas.vault.card import parse_card
from schemas.vault.rollup import (
    RollupInput,
    RollupKind,
    marker,
    parse_core,
    render_entries,
    transcript_entry,
)
from tests.vault.rollup_clock import ClockInput, MemoryClockWorkflow
from tests.vault.support import make_ctx, run_activity
from tests.vault.webhooks import webhook  # noqa: F401  (the fixture)
from workers.worker import MEMORY_WORKFLOWS, memory_activities, model_backends
from workflows.rollup import YearlyRollupWorkflow

START = date(2026, 5, 31)

# What the user says on given days; every other day is small talk.
SAYINGS = {
    date(2026, 5, 31): ["Anna Petrova works at Acme Corp.", "My goal is to ship Atlas."],
    date(2026, 6, 2): ["We decided to use PostgreSQL for billing.",
                       "Remember that the office wifi is keel-guest."],
    date(2026, 6, 5): ["No, that's wrong: the meeting is on Thursday."],
    date(2026, 6, 9): ["Ольга Смирнова работает в Альфа Логистик.", "Я предпочитаю созвоны утром."],
    date(2026, 6, 13): ["Project Atlas is due on September 30."],
    date(2026, 6, 20): ["Anna Petrova now works at TDI Group."],
    date(2026, 6, 24): ["My goal is to run a marathon.", "My goal is to learn Rust.",
                        "My goal is to read more."],
}


def write_month(vault) -> dict[date, int]:
    """Transcripts for May 31 .. June 30; returns each day's raw tokens."""
    sizes = {}
    for i in range(31):
        day = START + timedelta(days=i)
        text = f"# {day}\n"
        lines = SAYINGS.get(day, [])
        chatter = [f"Day {i}: reviewed the queue, item {n} looks fine, moving on to the next "
                   f"one after lunch with the team." for n in range(12)]
        for n, said in enumerate([chatter[0], *lines, *chatter[1:]]):
            at = datetime(day.year, day.month, day.day, 9, n, tzinfo=UTC)
            text += transcript_entry("s1", i * 100 + 2 * n, at, "user", said)
            text += transcript_entry("s1", i * 100 + 2 * n + 1, at, "assistant",
                                     "Understood, I have noted that and will keep it in mind.")
        vault.write(f"daily/{day}.md", text)
        sizes[day] = count_tokens(text)
    return sizes


def as_the_api(body: dict) -> dict | None:
    """The offline rollup's answer as the API would send it: named for the model asked."""
    reply = offline_rollup.respond(body)
    return reply and {**reply, "model": body["model"]}


async def test_a_month_of_nightly_rollups_in_seconds(time_skipping_env, tmp_path, database_url,
                                                    fake_anthropic, webhook):  # noqa: F811
    fake_anthropic.responder = as_the_api
    ctx = make_ctx(tmp_path, database_url,
                   ModelSettings(base_url=fake_anthropic.base_url, api_key="test"),
                   notify_webhook_url=webhook.url)
    ctx.vault.ensure()
    raw = write_month(ctx.vault)
    queue = f"memory-{uuid.uuid4()}"
    client = time_skipping_env.client
    acts = memory_activities(ctx.settings, database_url=database_url)
    async with Worker(client, task_queue=queue, workflows=[*MEMORY_WORKFLOWS,
                                                             MemoryClockWorkflow],
                      activities=acts):
        result = await client.execute_workflow(
            MemoryClockWorkflow.run,
            ClockInput(first_run=datetime(2026, 6, 1, 4, tzinfo=UTC), days=31),
            id=f"clock-{uuid.uuid4()}", task_queue=queue)
        yearly = await client.execute_workflow(
            YearlyRollupWorkflow.run,
            RollupInput(kind=RollupKind.YEARLY, as_of=datetime(2027, 1, 1, 4, 25, tzinfo=UTC)),
            id=f"yearly-{uuid.uuid4()}", task_queue=queue)
    assert result.finished - result.started >= timedelta(days=30)  # simulated, not waited
    root = ctx.vault.root
    dailies = sorted(p.stem for p in (root / "summaries/daily").glob("*.md"))
    assert dailies == [str(START + timedelta(days=i)) for i in range(31)]
    weeklies = sorted(p.stem for p in (root / "summaries/weekly").glob("*.md"))
    assert weeklies == ["2026-05-31", "2026-06-07", "2026-06-14", "2026-06-21"]
    assert (root / "summaries/monthly/2026-06.md").exists()
    assert yearly.periods == ["2026"] and (root / "summaries/yearly/2026.md").exists()
    assert not any(r.failures for r in result.reports)

    # SUPERSEDE kept the old employer in a dated History line.
    anna = parse_card((root / "cards/contacts/Anna Petrova.md").read_text())
    assert [f.value for _, f in anna.facts() if f.field == "employer"] == ["TDI Group"]
    assert anna.section("## History") == [
        "- 2026-05-31→2026-06-20: employer: Acme Corp (EXTRACTED)"]
    assert (root / "cards/contacts/Ольга Смирнова.md").exists()
    assert (root / "cards/decisions").glob("*PostgreSQL*.md")
    # No card line was written twice over the month.
    for card in (root / "cards").rglob("*.md"):
        lines = [ln for ln in card.read_text().splitlines() if ln.startswith("- ")]
        assert len(lines) == len(set(lines)), card

    core_text = (root / "CORE.md").read_text()
    core = parse_core(core_text)
    assert len(core_text) <= 1200
    assert core.goals == ["run a marathon", "learn Rust", "read more"]
    assert core.preferences == ["созвоны утром"]
    assert core.lessons and core.lessons[0].startswith("2026-06-05: ")

    # Daily and weekly reported through the webhook; monthly and yearly ran silent.
    titles = [p["title"] for p in webhook.posts]
    assert titles.count("Keel daily rollup") == 31
    assert titles.count("Keel weekly rollup") == 4
    assert not any("monthly" in t or "yearly" in t for t in titles)
    assert result.doctor_runs == 4
    # What the model was asked cost what the API counted: every request, once.
    spent = [r.spent for r in [*result.reports, yearly]]
    usages = fake_anthropic.usages
    assert len(usages) == len(fake_anthropic.requests) > 31
    assert sum(s.input_tokens for s in spent) == sum(u.input + u.cache_creation for u in usages)
    assert sum(s.output_tokens for s in spent) == sum(u.output for u in usages)
    assert all(s.usd > 0 for s in spent if s.input_tokens)
    daily_post = next(p for p in webhook.posts if p["title"] == "Keel daily rollup")
    assert "- model: $" in json.dumps(daily_post)

    # The cost of a week against its seven raw days.
    weekly_tokens = count_tokens((root / "summaries/weekly/2026-06-07.md").read_text())
    week_raw = sum(raw[START + timedelta(days=7 + i)] for i in range(7))
    assert weekly_tokens * 10 < week_raw


async def test_catch_up_runs_every_missed_day_once(tmp_path, database_url, fake_anthropic):
    fake_anthropic.responder = offline_rollup.respond
    ctx = make_ctx(tmp_path, database_url,
                   ModelSettings(base_url=fake_anthropic.base_url, api_key="test"))
    ctx.vault.ensure()
    for day in (date(2026, 6, 1), date(2026, 6, 2), date(2026, 6, 4)):
        ctx.vault.write(f"daily/{day}.md", f"# {day}\n" + transcript_entry(
            "s", 1, datetime(day.year, day.month, day.day, 9, tzinfo=UTC), "user",
            "Remember that the spare key is in the garage."))
    # One transcript got bytes that are not UTF-8 (a hand edit, a bad copy).
    bad = ctx.vault.path("daily/2026-06-02.md")
    bad.write_bytes(bad.read_bytes() + b"\nbroken \xff\xfe bytes\n")
    raw = bad.read_bytes()
    acts = RollupActivities(ctx, model_backends())
    # The worker was down for three nights: the run on the 5th finds all three days.
    due = await run_activity(acts.plan_rollup_periods, RollupPeriodsInput(
        kind=RollupKind.DAILY, as_of=datetime(2026, 6, 5, 9, tzinfo=UTC)))
    assert due.periods == ["2026-06-01", "2026-06-02", "2026-06-04"]
    assert "2026-06-03" in due.skipped
    from activities.vault.rollup import RollupStepInput
    results = {}
    for period in due.periods:
        step = RollupStepInput(kind=RollupKind.DAILY, period=period)
        await run_activity(acts.plan_rollup, step)
        results[period] = await run_activity(acts.apply_rollup, step)
    assert results["2026-06-02"].notes == [
        "daily/2026-06-02.md: 2 invalid UTF-8 sequences read as U+FFFD; the file was left "
        "as it is"]
    assert bad.read_bytes() == raw  # reported, nothing rewritten or deleted
    assert results["2026-06-01"].added == 1 and results["2026-06-02"].noop == 1
    calls = len(fake_anthropic.requests)
    # The same activity asked again (its retry) reports what its request cost; a later
    # run that reuses the stored plan asked nothing and reports nothing.
    retried = await run_activity(acts.plan_rollup, RollupStepInput(kind=RollupKind.DAILY,
                                                                    period="2026-06-01"))
    assert retried.reused and retried.spent.output_tokens == fake_anthropic.usages[0].output
    later = ActivityEnvironment()
    later.info = dataclasses.replace(later.info, workflow_run_id="a-later-run")
    again = await later.run(acts.plan_rollup, RollupStepInput(kind=RollupKind.DAILY,
                                                              period="2026-06-01"))
    assert again.reused and again.spent.output_tokens == 0
    assert len(fake_anthropic.requests) == calls
    due = await run_activity(acts.plan_rollup_periods, RollupPeriodsInput(
        kind=RollupKind.DAILY, as_of=datetime(2026, 6, 5, 9, tzinfo=UTC)))
    assert due.periods == []


def test_offline_rules_extract_facts_in_english_and_russian():
    entries = render_entries([
        ("user", "09:00", "Anna Petrova works at Acme Corp. I decided to move to Lisbon."),
        ("assistant", "09:01", "The meeting is on Friday."),
        ("user", "09:02", "No, it is on Thursday."),
        ("user", "09:03", "Борис Иванов теперь работает в Ромашка. Запомни, что код от "
                          "двери 4512."),
        ("user", "09:04", "Met Carl from Globex today."),
    ])
    request = {"system": marker(RollupKind.DAILY, "2026-06-01"),
               "messages": [{"role": "user", "content":
                             "<core>\n# Core\n## Goals\n- g1\n</core>\n<transcript>\n"
                             + "\n".join(entries) + "\n</transcript>"}]}
    reply = offline_rollup.respond(request)
    calls = [(b["name"], b["input"]) for b in reply["content"]]
    cards = {(c["type"], c["title"], c.get("field"), c["value"], c["confidence"], c["op"])
             for n, c in calls if n == "write_card"}
    assert ("contact", "Anna Petrova", "employer", "Acme Corp", "EXTRACTED", "ADD") in cards
    assert ("contact", "Борис Иванов", "employer", "Ромашка", "EXTRACTED", "SUPERSEDE") in cards
    assert ("contact", "Carl", "employer", "Globex", "INFERRED", "ADD") in cards
    assert any(c[0] == "decision" and "Lisbon" in c[3] for c in cards)
    assert any(c[0] == "note" and "4512" in c[3] for c in cards)
    core = dict(calls)["update_core"]
    assert core["goals"] == ["g1"] and "corrected" in core["lessons"][0]
    assert "Anna Petrova works at Acme Corp." in dict(calls)["write_summary"]["summary"]
    assert offline_rollup.respond({"system": "You are helpful.", "messages": []}) is None


def test_a_summary_that_is_a_symbolic_link_is_never_read(tmp_path, database_url):
    # A link to a host file in summaries/ failed every rollup that read summaries (a path
    # outside the vault); now only the vault's own files are.
    from activities.vault.rollup import _summary_paths

    ctx = make_ctx(tmp_path, database_url)
    ctx.vault.ensure()
    folder = f"summaries/{RollupKind.DAILY.value}"
    ctx.vault.write(f"{folder}/2026-06-01.md", "# 2026-06-01\n- the spare key\n")
    outside = tmp_path / "elsewhere.md"
    outside.write_text("# not the vault's\n")
    (ctx.vault.root / folder / "2026-06-02.md").symlink_to(outside)
    assert _summary_paths(ctx.vault, RollupKind.DAILY) == {
        "2026-06-01": f"{folder}/2026-06-01.md"}
    # A summaries folder that is itself a link to a host folder: not entered.
    host = tmp_path / "host-folder"
    host.mkdir()
    (host / "2026-W23.md").write_text("# not the vault's\n")
    weekly = ctx.vault.root / f"summaries/{RollupKind.WEEKLY.value}"
    if weekly.exists():
        shutil.rmtree(weekly)  # the template's (a .gitkeep)
    weekly.symlink_to(host, target_is_directory=True)
    assert _summary_paths(ctx.vault, RollupKind.WEEKLY) == {}
