"""The doctor on a vault with planted faults, a broken schema, a health drop; the five
Temporal Schedules on the dev server."""

import asyncio
import json
import subprocess
import uuid
from datetime import UTC, datetime, timedelta

from temporalio.client import ScheduleOverlapPolicy
from temporalio.worker import Worker

from activities.vault.doctor import DoctorActivities, DoctorStepInput
from activities.vault.search import search
from schemas.vault.card import split_frontmatter
from schemas.vault.doctor import DoctorInput, DoctorReport
from schemas.vault.nightly import NightlyReport
from tests.vault.support import make_ctx, run_activity
from tests.vault.webhooks import Webhook
from workers.schedules import ensure_memory_schedules, keep_memory_schedules, schedule_id
from workers.worker import MEMORY_WORKFLOWS, memory_activities
from workflows.doctor import DoctorWorkflow

AS_OF = datetime(2026, 6, 10, 5, tzinfo=UTC)

PLANTED = {
    # an alias type, an upper-case status, no dates, a link to a card that does not exist
    "cards/contacts/Anna Petrova.md":
        "---\ntype: Person\nstatus: ACTIVE\ntitle: Anna Petrova\n---\n# Anna Petrova\n\n"
        "## Facts\n- **employer**: Acme (EXTRACTED, 2026-01-01)\n"
        "- **employer**: TDI Group (EXTRACTED, 2026-05-01)\n\n## Links\n- [[Project Atlass]]\n",
    # the same person twice
    "cards/contacts/Anna Petrova (TDI).md":
        "---\ntype: contact\nstatus: active\ntitle: Anna Petrova (TDI)\ndescription: dup\n---\n"
        "# Anna Petrova (TDI)\n\n## Facts\n- works at TDI (EXTRACTED, 2026-05-01)\n",
    "cards/projects/Project Atlas.md":
        "---\ntype: project\nstatus: shipped\ndescription: Billing migration\n---\n"
        "# Project Atlas\n\nA person's own words, kept.\n\n## Links\n- [[Anna Petrova]]\n",
    # written by hand, no frontmatter at all
    "cards/notes/Loose note.md": "Just a thought, written in Obsidian.\n",
    # a type the schema does not know
    "cards/notes/Pancakes.md": "---\ntype: recipe\n---\n# Pancakes\n",
    # broken frontmatter
    "cards/ideas/Broken.md": "---\ntitle: Broken\nthis is: not: yaml: [\n---\n# Broken\n",
}


def planted_vault(ctx):
    ctx.vault.ensure()
    for rel, text in PLANTED.items():
        ctx.vault.write(rel, text)
    ctx.vault.write("CORE.md", "# Core\n\n## Facts\n" + "- a very long fact\n" * 80)


def files(root):
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if ".git/" not in p.as_posix() and p.is_file()}


async def test_doctor_repairs_what_it_may_and_reports_the_rest(client, tmp_path, database_url):
    hook = Webhook()
    ctx = make_ctx(tmp_path, database_url, notify_webhook_url=hook.url)
    planted_vault(ctx)
    root = ctx.vault.root
    before = files(root)
    queue = f"doctor-{uuid.uuid4()}"
    try:
        async with Worker(client, task_queue=queue, workflows=MEMORY_WORKFLOWS,
                          activities=memory_activities(ctx.settings, database_url=database_url)):
            report = await client.execute_workflow(
                DoctorWorkflow.run, DoctorInput(as_of=AS_OF), id=f"doctor-{uuid.uuid4()}",
                task_queue=queue)
    finally:
        hook.stop()
    steps = {s.step: s for s in report.steps}
    assert all(s.ok for s in report.steps), report.text()

    # enforce: alias coerced, statuses fixed, fields backfilled; only frontmatter touched
    anna, body = split_frontmatter((root / "cards/contacts/Anna Petrova.md").read_text())
    assert (anna["type"], anna["status"], anna["created"]) == ("contact", "active",
                                                               "2026-06-10")
    assert body == PLANTED["cards/contacts/Anna Petrova.md"].split("---\n", 2)[2]
    atlas, body = split_frontmatter((root / "cards/projects/Project Atlas.md").read_text())
    assert atlas["status"] == "active" and "A person's own words, kept." in body
    loose, _ = split_frontmatter((root / "cards/notes/Loose note.md").read_text())
    assert loose["type"] == "note" and loose["title"] == "Loose note"
    # what it may not repair stays byte for byte, and is reported
    for rel in ("cards/notes/Pancakes.md", "cards/ideas/Broken.md"):
        assert (root / rel).read_text() == PLANTED[rel]
    details = "\n".join(steps["enforce"].details)
    assert "unknown card type 'recipe'" in details and "Broken.md: frontmatter line 3" in details

    # graph, health history, MOC
    graph = json.loads((root / ".graph/vault-graph.json").read_text())
    assert ["cards/contacts/Anna Petrova.md", "Project Atlass"] in graph["broken"]
    history = (root / ".graph/health-history.jsonl").read_text().splitlines()
    assert len(history) == 1 and 0 <= json.loads(history[0])["score"] <= 100
    moc = (root / "MOC.md").read_text()
    assert "[[Anna Petrova]]" in moc and "[[Project Atlas]] (active) — Billing migration" in moc

    # dry-run scans queue findings; nothing is merged or relinked
    dedup = json.loads((root / ".graph/dedup-candidates.json").read_text())
    assert dedup and set(dedup[0]["paths"]) == {"cards/contacts/Anna Petrova.md",
                                                "cards/contacts/Anna Petrova (TDI).md"}
    supersede = json.loads((root / ".graph/supersede-candidates.json").read_text())
    assert "employer" in supersede[0]["detail"]
    cleanup = json.loads((root / ".graph/link-cleanup.json").read_text())
    assert cleanup[0]["suggestion"] == "[[Project Atlas]]"
    assert (root / "cards/contacts/Anna Petrova (TDI).md").exists()
    assert "[[Project Atlass]]" in (root / "cards/contacts/Anna Petrova.md").read_text()

    # CORE.md over its cap: reported, never cut
    assert steps["core"].alert and len((root / "CORE.md").read_text()) > 1200
    # nothing deleted; committed; one notification listing what needs a person
    assert before <= files(root)
    assert report.commit and report.commit.committed
    log = subprocess.run(["git", "-C", str(root), "log", "--oneline"], capture_output=True,
                         text=True).stdout
    assert "doctor: nightly maintenance" in log
    assert report.notified and len(hook.posts) == 1
    text = hook.posts[0]["text"]
    assert "CORE.md is" in text and "recipe" in text


async def test_symbolic_links_are_named_for_a_person_and_never_read(client, tmp_path,
                                                                  database_url):
    # A link to a host file (its text must never reach memory, and so the model) failed
    # every step before (a path outside the vault); a link back into the vault (a loop)
    # was passed over without a word. Both are now named, neither is read.
    ctx = make_ctx(tmp_path, database_url)
    ctx.vault.ensure()
    root = ctx.vault.root
    secret = tmp_path / "host-secret.md"
    secret.write_text("# Host file\nhunter-credential-7731\n")
    (root / "cards/notes/Outside.md").symlink_to(secret)
    (root / "cards/notes/loop").symlink_to(root)
    ctx.vault.write("cards/notes/Own words.md", "# Own words\nwombat orchard ledger\n")
    assert ctx.vault.linked_files() == ["cards/notes/Outside.md", "cards/notes/loop/"]
    assert "cards/notes/Own words.md" in ctx.vault.markdown_files()
    queue = f"doctor-{uuid.uuid4()}"
    async with Worker(client, task_queue=queue, workflows=MEMORY_WORKFLOWS,
                      activities=memory_activities(ctx.settings, database_url=database_url)):
        report = await client.execute_workflow(
            DoctorWorkflow.run, DoctorInput(as_of=AS_OF), id=f"doctor-{uuid.uuid4()}",
            task_queue=queue)
    assert all(s.ok for s in report.steps), report.text()
    details = "\n".join(next(s for s in report.steps if s.step == "enforce").details)
    assert "cards/notes/Outside.md: a symbolic link, never read" in details
    assert "cards/notes/loop/: a symbolic link, never read" in details
    assert secret.read_text() == "# Host file\nhunter-credential-7731\n"  # left as it is
    async with ctx.connection() as conn:
        assert not await search(conn, "hunter-credential-7731", scope=ctx.scope, k=5)
        found = await search(conn, "wombat orchard ledger", scope=ctx.scope, k=5)
    assert [h.path for h in found] == ["cards/notes/Own words.md"]


async def test_broken_schema_is_reported_and_no_card_changes(tmp_path, database_url):
    ctx = make_ctx(tmp_path, database_url)
    planted_vault(ctx)
    schema = json.loads((ctx.vault.root / "schema.json").read_text())
    schema["decay"]["rates"]["recipe"] = 0.5
    ctx.vault.write("schema.json", json.dumps(schema))
    before = {p: (ctx.vault.root / p).read_bytes() for p in PLANTED}
    out = await run_activity(DoctorActivities(ctx).doctor_enforce, DoctorStepInput(as_of=AS_OF))
    assert not out.ok and out.alert
    assert out.details == ["decay.rates.recipe: unknown type 'recipe'"]
    assert before == {p: (ctx.vault.root / p).read_bytes() for p in PLANTED}


async def test_a_health_drop_asks_for_a_person(tmp_path, database_url):
    ctx = make_ctx(tmp_path, database_url)
    ctx.vault.ensure()
    for name in ("A", "B", "C"):
        others = [o for o in ("A", "B", "C") if o != name]
        ctx.vault.write(f"cards/notes/{name}.md",
                        f"---\ntype: note\ndescription: {name}\n---\n# {name}\n\n## Links\n"
                        + "".join(f"- [[{o}]]\n" for o in others))
    acts = DoctorActivities(ctx)
    first = await run_activity(acts.doctor_graph, DoctorStepInput(as_of=AS_OF))
    assert not first.alert and first.data["score"] == 100 - 15
    for n in range(6):
        ctx.vault.write(f"cards/notes/Orphan {n}.md", "---\ntype: note\n---\n# Orphan\n")
    second = await run_activity(acts.doctor_graph,
                                DoctorStepInput(as_of=AS_OF + timedelta(days=1)))
    assert second.alert and second.data["previous"] == first.data["score"]
    again = await run_activity(acts.doctor_graph,
                               DoctorStepInput(as_of=AS_OF + timedelta(days=1)))
    history = (ctx.vault.root / ".graph/health-history.jsonl").read_text().splitlines()
    assert len(history) == 2 and again.data["previous"] == first.data["score"]


async def test_decay_moves_idle_cards_down_and_keeps_pinned_ones(tmp_path, database_url):
    ctx = make_ctx(tmp_path, database_url)
    ctx.vault.ensure()
    ctx.vault.write("cards/notes/Old.md", "---\ntype: note\nupdated: 2026-01-01\n---\n# Old\n")
    ctx.vault.write("cards/notes/Pinned.md",
                    "---\ntype: note\nupdated: 2026-01-01\npinned: true\n---\n# Pinned\n")
    out = await run_activity(DoctorActivities(ctx).doctor_decay, DoctorStepInput(as_of=AS_OF))
    assert out.data["changed"] == 2
    old, _ = split_frontmatter(ctx.vault.path("cards/notes/Old.md").read_text())
    pinned, _ = split_frontmatter(ctx.vault.path("cards/notes/Pinned.md").read_text())
    assert (old["tier"], old["relevance"]) == ("cold", 0.1)
    assert pinned["tier"] == "hot"
    again = await run_activity(DoctorActivities(ctx).doctor_decay, DoctorStepInput(as_of=AS_OF))
    assert again.data["changed"] == 0  # no nightly churn when nothing moved


async def test_schedules_are_created_updated_and_run(client, tmp_path, database_url):
    ctx = make_ctx(tmp_path, database_url, timezone="Europe/Berlin")
    ctx.vault.ensure()
    settings = ctx.settings.model_copy(update={"task_queue": f"sched-{uuid.uuid4()}"})
    created = await ensure_memory_schedules(client, settings)
    try:
        assert [s.created for s in created] == [True] * 5
        updated = await ensure_memory_schedules(client, settings)
        assert [s.created for s in updated] == [False] * 5
        crons = {}
        for s in created:
            desc = await client.get_schedule_handle(s.schedule_id).describe()
            assert desc.schedule.spec.time_zone_name == "Europe/Berlin"
            assert desc.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP
            assert desc.schedule.policy.catchup_window == timedelta(days=3)
            crons[s.schedule_id] = desc.schedule.spec

        def first(spec, field):
            return next(r.start for r in getattr(spec.calendars[0], field))

        assert first(crons[schedule_id(settings, "daily")], "hour") == 4
        assert first(crons[schedule_id(settings, "weekly")], "minute") == 15
        assert first(crons[schedule_id(settings, "weekly")], "day_of_week") == 0
        assert first(crons[schedule_id(settings, "monthly")], "day_of_month") == 1
        assert first(crons[schedule_id(settings, "yearly")], "month") == 1
        assert first(crons[schedule_id(settings, "doctor")], "hour") == 5
        doctor = client.get_schedule_handle(schedule_id(settings, "doctor"))
        # The schedules start the vault's workflows on the vault's own queue.
        async with Worker(client, task_queue=settings.vault_task_queue,
                          workflows=MEMORY_WORKFLOWS,
                          activities=memory_activities(settings, database_url=database_url)):
            await doctor.trigger()
            for _ in range(100):
                desc = await doctor.describe()
                if desc.info.recent_actions:
                    break
                await asyncio.sleep(0.1)
            started = desc.info.recent_actions[-1].action
            nightly = await client.get_workflow_handle(started.workflow_id,
                                                       result_type=NightlyReport).result()
            # The schedule runs every scope with a vault, each as its own child run.
            report = await client.get_workflow_handle(f"{started.workflow_id}-default",
                                                      result_type=DoctorReport).result()
        assert [o.scope for o in nightly.outcomes] == ["default"]
        assert nightly.outcomes[0].ok and not nightly.failed
        assert report.steps and all(s.ok for s in report.steps)
    finally:
        for s in created:
            await client.get_schedule_handle(s.schedule_id).delete()


async def test_a_cron_spec_temporal_refuses_leaves_out_its_job_alone(client, tmp_path,
                                                                     database_url, caplog):
    # One refused spec stopped the loop: the jobs after it were never scheduled, and the
    # log named no variable.
    ctx = make_ctx(tmp_path, database_url)
    memory = ctx.settings.memory.model_copy(update={"weekly_cron": "every sunday"})
    settings = ctx.settings.model_copy(update={"task_queue": f"sched-{uuid.uuid4()}",
                                               "memory": memory})
    made = await keep_memory_schedules(client, settings, first_s=0.1)
    try:
        assert [s.schedule_id for s in made] == [
            schedule_id(settings, job) for job in ("daily", "monthly", "yearly", "doctor")]
        refused = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(refused) == 1
        assert "schedule weekly was refused" in refused[0]
        assert "KEEL_ROLLUP_WEEKLY_CRON, is 'every sunday'" in refused[0]
    finally:
        for s in made:
            await client.get_schedule_handle(s.schedule_id).delete()
