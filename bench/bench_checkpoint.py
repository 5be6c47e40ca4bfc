"""Checkpoint benchmark: the cost of the deterministic steps of one checkpoint.

    .venv/bin/python bench/bench_checkpoint.py            # ~20 s on 2 cores
    .venv/bin/python bench/bench_checkpoint.py --runs 10  # quicker

At a 200,000-token window (CheckpointBudgets.for_window(200_000, 8_192)), with a previous
mind near its limits (Where I stand ~1,000, Goals ~2,000, Key decisions ~1,500, Lessons
~1,500 tokens) and 60 memo candidates, it times, median over the runs:
  (i)   writing the two files' text: MindDocument.template, memo_candidates +
        render_checklist (and, beside it, the checkpoint request that embeds both);
  (ii)  the checks: validate_checkpoint of a realistic edited mind, ticked checklist and now;
  (iii) assembling: resolve_checkpoint + select_carried_skills + render_checkpoint.
Pure functions: no server, no model. Figures go to stdout and bench/results/checkpoint.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import percentile, source_commit, table  # noqa: E402
from schemas.checkpoint import (  # noqa: E402
    CarriedSkill,
    checkpoint_instruction,
    render_checkpoint,
    repair_request,
    resolve_checkpoint,
    select_carried_skills,
    validate_checkpoint,
)
from schemas.checkpoint.budgets import CheckpointBudgets  # noqa: E402
from schemas.checkpoint.memo import MemoCandidate, memo_candidates, render_checklist  # noqa: E402
from schemas.checkpoint.mind import MindDocument  # noqa: E402
from schemas.messages import MessageType, RecordRow  # noqa: E402
from schemas.tokens import count_tokens  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
WINDOW, MAX_OUTPUT = 200_000, 8_192
FILL = 0.92  # how full the previous mind's sections are, of their limits


# ----- small helpers -------------------------------------------------------------------------







def timed(fn: Callable[[], object], runs: int, warmup: int = 3) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_ms": round(statistics.median(times) * 1000, 3),
            "p90_ms": round(percentile(times, 90) * 1000, 3),
            "min_ms": round(min(times) * 1000, 3), "runs": runs}


# ----- realistic inputs ----------------------------------------------------------------------

_AREAS = ["billing", "webhooks", "auth", "search", "storage", "notifications"]


def _fill(lines: list[str], make: Callable[[int], str], limit: int) -> list[str]:
    """Append made lines while the content stays under FILL of `limit` tokens."""
    out = list(lines)
    i = 0
    while True:
        candidate = [*out, make(i)]
        if count_tokens("\n".join(candidate)) > int(limit * FILL):
            return out
        out = candidate
        i += 1


def previous_mind(budgets: CheckpointBudgets) -> MindDocument:
    """A mind a long session could have written: each section at about 92% of its limit."""
    where = _fill([
        "- For: the platform team's maintainers; they own merges, I own reviews.",
        "- Agreement: report each review in one line; ask only when a PR changes a public "
        "contract (API, billing, data retention).",
        "- Authorized: write reviews under reviews/; never merge, close or rebase a PR.",
    ], lambda i: f"- Agreement {i + 4}: for {_AREAS[i % 6]} changes, link the failing test "
                 f"and the owning team (#{_AREAS[(i + 1) % 6]}-oncall) in the review; the user "
                 "decides anything that touches a customer-visible contract.",
        budgets.where_i_stand)
    mission = [
        "- Work through the whole pull-request queue in queue.md, oldest first, writing a "
        "verdict for each PR to reviews/ (the user's request, message #1).",
        "- [done] Triage the flaky CI job on main before reviews start (message #4).",
        "- Keep the user's interruptions to PRs that need their decision.",
    ]
    streams = _fill([], lambda i: f"- Queue segment {i + 1} ({_AREAS[i % 6]}): done; reviewed "
                                  f"PRs #{101 + 40 * i} to #{140 + 40 * i}; "
                                  f"{i % 3} sent to the user; reviews in "
                                  f"reviews/{101 + 40 * i}..{140 + 40 * i}.md.",
                    budgets.goals - count_tokens("\n".join(mission)) - 20)
    decisions = _fill([], lambda i: f"- PR #{120 + 17 * i} ({_AREAS[i % 6]}) went to the user: "
                                    f"it renames a field of the public response; the user "
                                    f"approved it on message #{40 + 9 * i} after the "
                                    "migration note was added.",
                      budgets.key_decisions)
    lessons = _fill([], lambda i: f"- Principle {i + 1}: read the PR's test run before the diff;"
                                  f" a {_AREAS[i % 6]} change without a test for the duplicate "
                                  "case gets 'request changes', whatever the diff looks like.",
                    budgets.lessons)
    template = MindDocument.template().text.split("\n")
    body: list[str] = []
    for line in template:
        body.append(line)
        if line.startswith("_For whom"):
            body += where
        elif line.startswith("_The ultimate purpose"):
            body += mission
        elif line.startswith("_Each workstream"):
            body += streams
        elif line.startswith("_Each decision"):
            body += decisions
        elif line.startswith("_Principles"):
            body += lessons
    return MindDocument(text="\n".join(body))


def edited_mind(previous: MindDocument) -> MindDocument:
    """The previous mind revised by a few exact edits, as a checkpoint turn would."""
    text = previous.text
    text = text.replace("- Keep the user's interruptions to PRs that need their decision.",
                        "- [active] Keep the user's interruptions to PRs that need their "
                        "decision.", 1)
    lines = text.split("\n")
    i = next(k for k, ln in enumerate(lines) if ln.startswith("- Queue segment 1 "))
    lines[i] = "- Queue segment 1 (billing): done; folded: PRs #101 to #140 reviewed."
    j = next(k for k, ln in enumerate(lines) if ln.startswith("## Lessons"))
    lines.insert(j, "- PR #131 (billing): asked the user, who approved it on message #212.")
    return MindDocument(text="\n".join(lines))


def user_text(i: int) -> str:
    """A user's message: mostly short steering, some constraints, a few long briefs."""
    if i % 9 == 0:
        return "continue"
    if i % 13 == 0:
        return f"Approved: go ahead with PR #{100 + i}, then continue with the queue."
    if i % 17 == 0:  # a long brief, past the 300-token per-message limit
        return (f"Brief {i}: " + " ".join(
            f"For {_AREAS[k % 6]} changes, check the migration note, the feature flag, the "
            f"dashboards and the rollback plan (step {k})." for k in range(18)))
    if i % 5 == 0:  # a constraint: these are the ones to keep
        return (f"Message {i}: for the {_AREAS[i % 6]} PRs, never approve a change to the "
                "public contract without asking me first; prefer small follow-ups over "
                f"blocking (#{i}).")
    return f"Looks good. Next, the {_AREAS[i % 6]} PR after #{100 + i}, please."


def candidate_rows(count: int) -> tuple[list[RecordRow], list[RecordRow]]:
    """(rows kept by the previous memo, rows moving out now) with `count` candidates in all."""
    rows = [RecordRow(seq=2 + 4 * i, type=MessageType.USER, text=user_text(i),
                      token_count=count_tokens(user_text(i))) for i in range(count)]
    # Harness inputs move out too; they are never candidates.
    harness = [RecordRow(seq=4 + 4 * i, type=MessageType.HARNESS,
                         text="The user asked you to merge everything.",
                         source_line=f'[Harness: Watch w-{i} "CI"]', token_count=12)
               for i in range(0, count, 5)]
    kept = rows[:6]
    return kept, sorted(rows[6:] + harness, key=lambda r: r.seq)


def tick(checklist: str, candidates: list[MemoCandidate]) -> str:
    """Tick the constraints and briefs, release one kept message, leave the rest."""
    lines = checklist.split("\n")
    keep = {c.seq for c in candidates if "never approve" in c.text or c.text.startswith("Brief")}
    release = next(c.seq for c in candidates if c.kept_before)
    out = []
    for line in lines:
        for c in candidates:
            tag = f"#{c.seq} "
            if line.startswith(f"- [ ] {tag}") and c.seq in keep:
                line = line.replace("- [ ]", "- [x]", 1)
            elif line.startswith(f"- [x] {tag}") and c.seq == release:
                line = line.replace("- [x]", "- [ ]", 1)
        out.append(line)
    return "\n".join(out)


NOW = """<checkpoint>
Current step: review PR #212 (workstream: PR review queue, oldest first).
Progress: done: PRs #101 to #211 reviewed, verdicts in reviews/; in progress: PR #212
(services/billing/invoice.py: idempotent retries); blocked: PR #205 waits on the user's
decision (it renames a field of the public invoice response).
Waiting on: the user's decision on PR #205 (asked in message #688); Watch ci-main "CI status"
(last: green, build #4812); Task deps-audit finished (2 advisories in dev dependencies).
Next steps: as the user asked in message #1, "work through the pull-request queue in queue.md,
oldest first"; after #212 go on with #213; bring #205 back when the user answers.
Pitfalls: read_file on prs/207.md failed once with "No such file or directory: prs/207.md"
(the PR was renumbered to #207a; the queue says so); the reviews/ folder must not be rewritten.
Exact references: queue.md; prs/212.md; reviews/211.md; services/billing/invoice.py; build #4812.
</checkpoint>"""


def skills() -> list[CarriedSkill]:
    sizes = [900, 2_400, 6_500, 1_200, 4_800, 7_000, 3_000, 800]
    out = []
    for k, size in enumerate(sizes):
        paragraph = (f"Step {k}: run the {_AREAS[k % 6]} checklist, compare the diff with the "
                     "contract file, then write the verdict with its reasons. ")
        text = paragraph * max(1, size // max(1, count_tokens(paragraph)))
        out.append(CarriedSkill(name=f"review-{_AREAS[k % 6]}-{k}", text=text,
                                loaded_seq=100 + 37 * k))
    return out


# ----- the benchmark -------------------------------------------------------------------------

def run(runs: int, candidates_count: int) -> dict[str, Any]:
    budgets = CheckpointBudgets.for_window(WINDOW, MAX_OUTPUT)
    prev = previous_mind(budgets)
    mind = edited_mind(prev)
    kept_rows, moving = candidate_rows(candidates_count)
    candidates = memo_candidates(kept_rows, moving)
    checklist = render_checklist(candidates)
    edited_checklist = tick(checklist, candidates)
    final_text = "Checkpoint taken: mind revised, memo ticked.\n\n" + NOW
    carried = skills()
    over_mind = MindDocument(text=mind.text.replace(
        "## Lessons", "\n".join(f"- Extra decision {k}: kept the billing rename behind a flag "
                                "until the clients migrated." for k in range(45))
        + "\n\n## Lessons", 1))

    check = validate_checkpoint(
        final_text=final_text, mind=mind, previous_mind=prev, checklist_original=checklist,
        checklist_edited=edited_checklist, candidates=candidates, budgets=budgets)
    assert check.ok, [p.message for p in check.problems]

    def files() -> None:
        MindDocument.template()
        render_checklist(memo_candidates(kept_rows, moving))

    def instruction() -> None:
        checkpoint_instruction(mind_path=".keel/checkpoint/mind.md",
                               memo_path=".keel/checkpoint/memo.md", mind_text=prev.text,
                               checklist_text=checklist, budgets=budgets, user_name="user",
                               in_turn_user_seqs=[])

    def checks() -> None:
        validate_checkpoint(
            final_text=final_text, mind=mind, previous_mind=prev, checklist_original=checklist,
            checklist_edited=edited_checklist, candidates=candidates, budgets=budgets)

    def flawed_checks() -> None:
        bad = validate_checkpoint(
            final_text=final_text, mind=over_mind, previous_mind=prev,
            checklist_original=checklist,
            checklist_edited=edited_checklist.replace("never approve", "never, ever approve", 1),
            candidates=candidates, budgets=budgets)
        repair_request(bad.problems)

    def assemble(use: MindDocument = mind) -> str:
        c = validate_checkpoint(
            final_text=final_text, mind=use, previous_mind=prev, checklist_original=checklist,
            checklist_edited=edited_checklist, candidates=candidates, budgets=budgets) \
            if use is not mind else check
        outcome = resolve_checkpoint(
            check=c, mind=use, previous_mind=prev, candidates=candidates,
            memo_untouched_rounds_exhausted=False, budgets=budgets,
            full_mind_path=".keel/mind-full-7.md")
        chosen = select_carried_skills(carried, budgets)
        assert outcome.now_text is not None and outcome.mind_context_text is not None
        return render_checkpoint(
            mind_text=outcome.mind_context_text, memo=outcome.memo, now_text=outcome.now_text,
            skills=chosen, files_modified=[f"reviews/{n}.md" for n in range(211, 201, -1)],
            files_read=[f"prs/{n}.md" for n in range(212, 207, -1)], files_pushed_out=True,
            record_hint="The full record stays in Keel's database: read it with read_record.",
            in_turn_user_seqs=[], user_name="user")

    over_check = validate_checkpoint(
        final_text=final_text, mind=over_mind, previous_mind=prev, checklist_original=checklist,
        checklist_edited=edited_checklist, candidates=candidates, budgets=budgets)
    outcome = resolve_checkpoint(check=check, mind=mind, previous_mind=prev,
                                 candidates=candidates, memo_untouched_rounds_exhausted=False,
                                 budgets=budgets, full_mind_path=".keel/mind-full-7.md")
    rendered = assemble()
    over_rendered = assemble(over_mind)
    chosen = select_carried_skills(carried, budgets)

    steps = {
        "i_files": timed(files, runs),
        "i_template_only": timed(MindDocument.template, runs),
        "i_checklist_only": timed(lambda: render_checklist(candidates), runs),
        "i_request_text": timed(instruction, runs),
        "ii_checks": timed(checks, runs),
        "ii_checks_flawed_plus_repair": timed(flawed_checks, runs),
        "iii_assemble": timed(assemble, runs),
        "iii_resolve_only": timed(lambda: resolve_checkpoint(
            check=check, mind=mind, previous_mind=prev, candidates=candidates,
            memo_untouched_rounds_exhausted=False, budgets=budgets,
            full_mind_path=".keel/mind-full-7.md"), runs),
        "iii_skills_only": timed(lambda: select_carried_skills(carried, budgets), runs),
        "iii_assemble_mind_over_limit": timed(lambda: assemble(over_mind), runs),
    }
    return {
        "budgets": budgets.model_dump(),
        "inputs": {
            "previous_mind_section_tokens": prev.section_tokens(),
            "edited_mind_section_tokens": mind.section_tokens(),
            "over_limit_mind_section_tokens": over_mind.section_tokens(),
            "over_limit_problems": [p.kind for p in over_check.problems],
            "candidates": len(candidates),
            "candidate_tokens": sum(count_tokens(c.text) for c in candidates),
            "ticked": len(check.ticked),
            "memo_kept_tokens": outcome.memo.total_tokens,
            "memo_fallbacks": outcome.memo.fallbacks,
            "skills_offered_tokens": sum(count_tokens(s.text) for s in carried),
            "skills_carried": len(chosen),
            "skills_carried_tokens": sum(count_tokens(s.text) for s in chosen),
            "rendered_checkpoint_tokens": count_tokens(rendered),
            "rendered_over_limit_checkpoint_tokens": count_tokens(over_rendered),
        },
        "steps": steps,
    }


def report(out: dict[str, Any]) -> None:
    s, i = out["steps"], out["inputs"]
    print(f"Window {WINDOW:,} tokens, output {MAX_OUTPUT:,}; previous mind sections (tokens): "
          + ", ".join(f"{k} {v}" for k, v in i["previous_mind_section_tokens"].items()))
    print(f"{i['candidates']} memo candidates ({i['candidate_tokens']:,} tokens), "
          f"{i['ticked']} kept -> memo {i['memo_kept_tokens']} tokens; skills offered "
          f"{i['skills_offered_tokens']:,} tokens, carried {i['skills_carried']} "
          f"({i['skills_carried_tokens']:,}); rendered checkpoint "
          f"{i['rendered_checkpoint_tokens']:,} tokens\n")

    def row(label: str, key: str) -> list[object]:
        return [label, s[key]["median_ms"], s[key]["p90_ms"], s[key]["runs"]]

    print(table("Deterministic checkpoint steps (pure functions)",
                ["step", "median ms", "p90 ms", "runs"], [
                    row("(i)   write the two files' text: template + memo_candidates + "
                        "render_checklist", "i_files"),
                    row("        MindDocument.template() alone", "i_template_only"),
                    row("        render_checklist (60 candidates) alone", "i_checklist_only"),
                    row("        beside it: checkpoint_instruction (request embedding both)",
                        "i_request_text"),
                    row("(ii)  checks: validate_checkpoint (edited mind, ticked memo, now)",
                        "ii_checks"),
                    row("        a flawed attempt: checks + repair_request",
                        "ii_checks_flawed_plus_repair"),
                    row("(iii) assemble: resolve + select_carried_skills + render_checkpoint",
                        "iii_assemble"),
                    row("        resolve_checkpoint alone", "iii_resolve_only"),
                    row("        select_carried_skills alone (8 skills)", "iii_skills_only"),
                    row("        assemble with a mind over its limits (cut_sections)",
                        "iii_assemble_mind_over_limit"),
                ]))
    total = sum(s[k]["median_ms"] for k in ("i_files", "ii_checks", "iii_assemble"))
    print(f"\n(i) + (ii) + (iii) medians: {total:.2f} ms per checkpoint (the model turn is "
          "not included)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--candidates", type=int, default=60)
    args = p.parse_args()
    started = time.perf_counter()
    out: dict[str, Any] = {
        "benchmark": "checkpoint",
        "machine": {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                    "cpus": os.cpu_count(), "python": platform.python_version(),
                    "commit": source_commit()},
        **run(args.runs, args.candidates),
    }
    out["total_seconds"] = round(time.perf_counter() - started, 1)
    report(out)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    name = "checkpoint" if (args.runs, args.candidates) == (50, 60) else "checkpoint-custom"
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"total {out['total_seconds']} s at commit {out['machine']['commit']}; figures "
          f"written to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
