"""The nightly fan-out over memory scopes: a simulated week on the time-skipping server
with two scopes and one broken one (its vault is not a git repository). Each scope's
rollups read and write its own vault only; the broken scope is reported and the others run.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from datetime import UTC, date, datetime, timedelta

from temporalio.worker import Worker

from activities.offline import rollup as offline_rollup
from schemas.config import ModelSettings
from schemas.vault.nightly import NightlyJob
from schemas.vault.rollup import transcript_entry
from tests.vault.scope_clock import ScopeClockInput, ScopeClockWorkflow
from tests.vault.support import make_ctx
from tests.vault.webhooks import webhook  # noqa: F401  (the fixture)
from workers.worker import MEMORY_WORKFLOWS, memory_activities

START = date(2026, 5, 31)  # a Sunday: the week 05-31 .. 06-06 closes on 06-07
MARKERS = {"alice": ("A-1001", "blue"), "bob": ("B-2002", "red"), "carol": ("C-3003", "green")}


def transcripts(root, scope: str) -> None:
    marker, colour = MARKERS[scope]
    for i in range(7):
        day = START + timedelta(days=i)
        text = f"# {day}\n"
        said = [f"My kettle order {marker} is the {colour} kettle, it ships on day {i}.",
                f"Anna Petrova works at {colour.title()} Kettles Ltd.",
                "We talked about the kettle order and the delivery again."]
        for n, line in enumerate(said):
            at = datetime(day.year, day.month, day.day, 9, n, tzinfo=UTC)
            text += transcript_entry(f"{scope}-s", i * 10 + n, at, "user", line)
        (root / "daily").mkdir(parents=True, exist_ok=True)
        (root / "daily" / f"{day}.md").write_text(text)


def files_text(root) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(root.rglob("*.md"))
                     if ".git" not in p.parts)


async def test_a_week_of_rollups_per_scope_with_one_broken_vault(
        time_skipping_env, tmp_path, database_url, fake_anthropic, webhook) -> None:  # noqa: F811
    fake_anthropic.responder = offline_rollup.respond
    ctx = make_ctx(tmp_path, database_url,
                   ModelSettings(base_url=fake_anthropic.base_url, api_key="test"),
                   notify_webhook_url=webhook.url)
    roots = {}
    for scope in ("alice", "bob"):
        vault = ctx.scoped(scope).vault
        vault.ensure()
        transcripts(vault.root, scope)
        roots[scope] = vault.root
    carol = tmp_path / "vaults" / "carol"  # a folder that is not a git repository
    transcripts(carol, "carol")
    roots["carol"] = carol
    queue = f"memory-{uuid.uuid4()}"
    client = time_skipping_env.client
    async with Worker(client, task_queue=queue,
                      workflows=[*MEMORY_WORKFLOWS, ScopeClockWorkflow],
                      activities=memory_activities(ctx.settings, database_url=database_url)):
        result = await client.execute_workflow(
            ScopeClockWorkflow.run,
            ScopeClockInput(first_run=datetime(2026, 6, 1, 4, tzinfo=UTC), days=7),
            id=f"scope-clock-{uuid.uuid4()}", task_queue=queue)
    assert result.finished - result.started >= timedelta(days=6)  # simulated, not waited

    by_job: dict[NightlyJob, list] = {}
    for report in result.reports:
        by_job.setdefault(report.job, []).append(report)
    assert len(by_job[NightlyJob.DAILY]) == 7 and len(by_job[NightlyJob.WEEKLY]) == 1
    for report in by_job[NightlyJob.DAILY] + by_job[NightlyJob.WEEKLY]:
        outcomes = {o.scope: o for o in report.outcomes}
        assert sorted(outcomes) == ["alice", "bob", "carol"]  # every scope with a vault
        assert outcomes["alice"].ok and outcomes["bob"].ok, outcomes
        assert not outcomes["carol"].ok
        assert "not a git repository" in outcomes["carol"].summary
        assert report.failed == ["carol"] and report.notified
    doctor = {o.scope: o for o in by_job[NightlyJob.DOCTOR][0].outcomes}
    assert "not a git repository" in doctor["carol"].summary

    days = [str(START + timedelta(days=i)) for i in range(7)]
    for scope in ("alice", "bob"):
        root = roots[scope]
        assert sorted(p.stem for p in (root / "summaries/daily").glob("*.md")) == days
        assert (root / "summaries/weekly/2026-05-31.md").exists()
        log = subprocess.run(["git", "-C", str(root), "log", "--format=%s"],
                             capture_output=True, text=True, check=True).stdout
        assert "rollup daily: 2026-06-06" in log and "rollup weekly: 2026-05-31" in log
    # Nothing of one scope in another's files: summaries, cards, CORE.md, transcripts.
    for scope, root in roots.items():
        text = files_text(root)
        assert MARKERS[scope][0] in text
        for other, (marker, colour) in MARKERS.items():
            if other != scope:
                assert marker not in text and f"{colour.title()} Kettles" not in text, \
                    (scope, other)
    assert not (carol / ".git").exists()  # the broken vault was reported, never "fixed"
    # Every request the model got held one scope's material only.
    assert fake_anthropic.requests
    for body in fake_anthropic.requests:
        text = json.dumps(body, ensure_ascii=False)
        assert sum(m in text for m, _ in MARKERS.values()) <= 1
    # The nightly notification named the broken scope.
    nightly = [p for p in webhook.posts if p["title"] == "Keel nightly daily"]
    assert len(nightly) == 7 and all("carol" in p["text"] for p in nightly)
    assert not any("alice" in p["text"] or "bob" in p["text"] for p in nightly)
