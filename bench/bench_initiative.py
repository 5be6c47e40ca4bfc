"""Initiative benchmark: how close to its time a wakeup fires, and what a delegate costs.

    .venv/bin/python bench/bench_initiative.py            # ~1-2 min on 2 cores
    .venv/bin/python bench/bench_initiative.py --quick    # a smoke run

One embedded stack (PostgreSQL + Temporal dev server), a fake Messages API answering at
once, one worker. Three measurements:

a. One-shot wakeups: sessions each schedule a wakeup two seconds ahead (a workflow timer);
   lateness is the Task row's `created_at` in the record minus the wakeup's `due`. Bar:
   p95 within 1 s.
b. A recurring wakeup (`every_s=2`, the shortest Keel allows; a Temporal Schedule signalling
   the session): lateness is the row's `created_at` minus the fire's due time (the
   wakeup's creation plus whole intervals; its input id names which fire it was).
c. A delegate round trip (`delegate`, wait=true, the child answers at once: the parent's
   model call, the child's start, its turn, its answer back, the parent's next model
   call) against a plain turn (one model call), both `SessionHandle.ask`, interleaved,
   each followed by a pause (`--pause`, 0.25 s) so what one leaves running after its
   answer (the child's last workflow task and its end) never lands in the next one's
   time. Bar: the delegate median within 3x the plain median.

Beside the times, this process's CPU (client, worker and fake API) per plain turn and per
round trip (each with its pause: its after-work included), and figures that do not depend
on load, from the server's histories: events and workflow tasks per delegate round trip
(the parent's, and each child's whole run) and per plain turn; for each one-shot, when
its timer fired (the server's TIMER_FIRED minus the wakeup's due), when the session took
the fire (the workflow task that handles it started), and the workflow tasks and
activities from that timer to the turn's model call.
The bar is on the Task row (a), which the first activity after the fire writes.

The machine is shared with other work while it runs (the JSON says so); figures go to
stdout and bench/results/initiative.json (initiative-quick.json for --quick).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.api.history.v1 import HistoryEvent  # noqa: E402
from temporalio.client import Client  # noqa: E402

from bench.common import cancel_on_sigterm, percentile, table  # noqa: E402
from bench.stack import bench_stack, finish, machine, ms  # noqa: E402
from keel.client import KeelClient, SessionHandle, session_config  # noqa: E402
from schemas.agent import CHILD_NOTE, AgentSpec  # noqa: E402
from schemas.config import ModelSettings  # noqa: E402
from schemas.initiative import SubAgent, WakeupLimits, interval_start  # noqa: E402
from tests.fake_anthropic import FakeAnthropic, text_message, tool_use_message  # noqa: E402
from workers.worker import build_worker  # noqa: E402

SPEC = AgentSpec(instructions="Benchmark agent.",
                 wakeups=WakeupLimits(min_interval_s=1, max_active=10, expiry_s=3600),
                 sub_agents=[SubAgent(name="helper", instructions="Answer at once.")])
LOAD_NOTE = ("measured on a 2-core machine shared with other helpers' test runs and "
             "benchmarks at the same time: absolute figures are pessimistic")


def say(text: str) -> None:
    print(text, flush=True)


def respond(body: dict[str, Any]) -> dict[str, Any]:
    system = body.get("system") or ""
    system = system if isinstance(system, str) else " ".join(
        b.get("text", "") for b in system)
    if CHILD_NOTE in system:
        return text_message("child answer")
    last = body["messages"][-1]["content"]
    blocks = [{"type": "text", "text": last}] if isinstance(last, str) else last
    if any(b.get("type") == "tool_result" for b in blocks):
        return text_message("done")
    text = " ".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    if "wake me" in text:
        return tool_use_message([("schedule_wakeup", {"note": "bench", "after_s": 2})])
    if "every two seconds" in text:
        return tool_use_message([("schedule_wakeup", {"note": "tick", "every_s": 2,
                                                      "expires_in_s": 24})])
    if "delegate" in text:
        return tool_use_message([("delegate", {"agent": "helper", "task": "answer"})])
    return text_message("plain answer")


def task_rows(database_url: str, session_id: str) -> list[tuple[str, datetime]]:
    with psycopg.connect(database_url) as conn:
        return conn.execute(
            "SELECT input_id, created_at FROM messages WHERE session_id=%s AND "
            "source_line LIKE '[Harness: Task wakeup %%' ORDER BY seq",
            (session_id,)).fetchall()


_WT_DONE = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED


async def history(client: Client, workflow_id: str) -> list[HistoryEvent]:
    return list((await client.get_workflow_handle(workflow_id).fetch_history()).events)


def counts(events: list[HistoryEvent]) -> tuple[int, int]:
    """Events, and workflow tasks (completed), in `events`."""
    return len(events), sum(1 for e in events if e.event_type == _WT_DONE)


def fire_paths(events: list[HistoryEvent], dues: list[datetime]) -> list[dict[str, float]]:
    """For each timer that fired: how late the server fired it (against the nearest due
    before it), and the workflow tasks and activities from it to the next model call."""
    out = []
    for i, e in enumerate(events):
        if e.event_type != EventType.EVENT_TYPE_TIMER_FIRED:
            continue
        fired = e.event_time.ToDatetime().replace(tzinfo=dues[0].tzinfo) if dues else None
        due = max((d for d in dues if fired and d <= fired), default=None)
        tasks = activities = 0
        taken = next((later.event_time.ToDatetime().replace(tzinfo=dues[0].tzinfo)
                      for later in events[i + 1:]
                      if later.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED),
                     None)
        for later in events[i + 1:]:
            if later.event_type == _WT_DONE:
                tasks += 1
            if later.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                if later.activity_task_scheduled_event_attributes.activity_type.name \
                        == "call_model":
                    break
                activities += 1
        if fired and due and (fired - due).total_seconds() < 2:
            out.append({"timer_late_ms": ms((fired - due).total_seconds()),
                        "taken_late_ms": ms(((taken or fired) - due).total_seconds()),
                        "workflow_tasks": tasks, "activities": activities})
    return out


async def one_shot(session: SessionHandle, database_url: str, rounds: int,
                   dues: list[datetime]) -> list[float]:
    """Lateness of `rounds` one-shot wakeups in one session, one after another."""
    out: list[float] = []
    for _ in range(rounds):
        before = len(task_rows(database_url, session.session_id))
        await session.ask("wake me in two seconds")
        due = max((w.due for w in await session.wakeups() if w.due), default=None)
        assert due is not None
        dues.append(due)
        for _ in range(200):
            rows = task_rows(database_url, session.session_id)
            if len(rows) > before:
                out.append((rows[-1][1] - due).total_seconds())
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # its turn
    return out


async def recurring(session: SessionHandle, database_url: str) -> list[float]:
    await session.ask("tick every two seconds")
    wakeup = (await session.wakeups())[0]
    assert wakeup.every_s
    await asyncio.sleep(25)
    out = []
    for input_id, created in task_rows(database_url, session.session_id):
        stamp = input_id.split("-", 2)[2]  # wakeup-<id>-<the schedule's fire time, to the s>
        if "T" not in stamp:
            say(f"   (not a scheduled fire: {input_id})")
            continue
        # The fires are due at the wakeup's creation, up to the whole second, plus whole
        # intervals; the input id holds the one it was, cut to the second.
        start = interval_start(wakeup.created)
        k = round((datetime.fromisoformat(stamp) - start).total_seconds() / wakeup.every_s)
        fire = start + timedelta(seconds=k * wakeup.every_s)
        out.append((created - fire).total_seconds())
    return out


async def turns(session: SessionHandle, text: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        outcome = await session.ask(text)
        out.append(time.perf_counter() - start)
        assert outcome.error is None, outcome
    return out


async def round_trip_counts(client: Client, team: SessionHandle,
                            before: list[tuple[int, int]], sessions: list[SessionHandle],
                            turns: int) -> dict[str, float]:
    """Events and workflow tasks per plain turn and per delegate round trip (the parent's
    share, and each child's whole run, over the measured turns)."""
    after = [counts(await history(client, s.session_id)) for s in sessions]
    children = [c.session_id for c in (await team.status()).children][-turns:]
    child = [counts(await history(client, c)) for c in children]
    per = [[(a[k] - b[k]) / turns for k in (0, 1)] for a, b in zip(after, before,
                                                                    strict=True)]
    child_events = sum(c[0] for c in child) / len(child)
    child_tasks = sum(c[1] for c in child) / len(child)
    return {"plain_events_per_turn": per[0][0], "plain_workflow_tasks_per_turn": per[0][1],
            "parent_events_per_round_trip": per[1][0],
            "parent_workflow_tasks_per_round_trip": per[1][1],
            "child_events": child_events, "child_workflow_tasks": child_tasks,
            "round_trip_events": per[1][0] + child_events,
            "round_trip_workflow_tasks": per[1][1] + child_tasks}


def stats(values: list[float]) -> dict[str, float]:
    return {"median": ms(percentile(values, 50)), "p95": ms(percentile(values, 95)),
            "max": ms(max(values)) if values else float("nan"), "n": len(values)}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    cancel_on_sigterm()
    fake = FakeAnthropic(respond).start()
    model = ModelSettings(name="fake-model", base_url=fake.base_url, api_key="x",
                          request_timeout_s=30)
    out: dict[str, Any] = {"benchmark": "initiative", "machine": machine(),
                           "load": LOAD_NOTE, "loadavg_1m_at_start": os.getloadavg()[0]}
    t0 = time.perf_counter()
    try:
        async with bench_stack(model) as (client, settings):
            async with build_worker(client, settings):
                keel = KeelClient(client, settings.task_queue, settings)
                url = settings.database_url or ""

                # No long memory: one session's transcripts must not be recalled into
                # another's prompt (and the plain turn is then one model call).
                config = session_config(settings, memory_scope=None, agent=SPEC)

                async def start(name: str) -> SessionHandle:
                    return await keel.start_session(f"{name}-{uuid.uuid4().hex[:6]}",
                                                    config=config)
                say("stack up; one-shot wakeups...")
                wakers = [await start("wake") for _ in range(args.sessions)]
                dues: list[list[datetime]] = [[] for _ in wakers]
                shots = await asyncio.gather(*[one_shot(w, url, args.rounds, d)
                                               for w, d in zip(wakers, dues, strict=True)])
                late = [x for s in shots for x in s]
                paths = [p for w, d in zip(wakers, dues, strict=True)
                         for p in fire_paths(await history(client, w.session_id), d)]
                say("a recurring wakeup...")
                ticks = await recurring(await start("tick"), url)
                say("plain turns and delegate round trips...")
                plain_s, team_s = await start("plain"), await start("team")
                await turns(plain_s, "warm up", 2)
                await turns(team_s, "delegate: warm up", 1)
                plain: list[float] = []
                team: list[float] = []
                before = [counts(await history(client, s.session_id))
                          for s in (plain_s, team_s)]
                cpu = [0.0, 0.0]  # this process's (client, worker, fake API), per kind
                for _ in range(args.turns):  # interleaved, so load hits both alike
                    for i, (s, text, into) in enumerate(((plain_s, "a plain question", plain),
                                                         (team_s, "delegate this", team))):
                        start_cpu = time.process_time()
                        into += await turns(s, text, 1)
                        # Apart: what a call leaves running after its answer (a child's
                        # last workflow task, its end) lands in its own window, counted
                        # with its CPU, never in the next call's time.
                        await asyncio.sleep(args.pause)
                        cpu[i] += time.process_time() - start_cpu
                out["process_cpu_ms"] = {
                    "plain_turn": ms(cpu[0] / args.turns),
                    "delegate_round_trip": ms(cpu[1] / args.turns),
                    "ratio": round(cpu[1] / cpu[0], 2) if cpu[0] else None}
                out["histories"] = await round_trip_counts(client, team_s, before,
                                                           [plain_s, team_s], args.turns)
    finally:
        fake.stop()
    out["one_shot_lateness_ms"] = stats(late)
    out["one_shot_timer_late_ms"] = stats([p["timer_late_ms"] / 1000 for p in paths])
    out["one_shot_taken_late_ms"] = stats([p["taken_late_ms"] / 1000 for p in paths])
    out["one_shot_fire_to_model_call"] = {
        "workflow_tasks": sorted({p["workflow_tasks"] for p in paths}),
        "activities": sorted({p["activities"] for p in paths})}
    out["one_shot_bar_p95_within_1s"] = percentile(late, 95) <= 1.0
    out["recurring_lateness_ms"] = stats(ticks)
    out["pause_s"] = args.pause
    out["plain_turn_ms"] = stats(plain)
    out["delegate_round_trip_ms"] = stats(team)
    ratio = percentile(team, 50) / percentile(plain, 50)
    out["delegate_over_plain_median"] = round(ratio, 2)
    out["delegate_bar_within_3x"] = ratio <= 3.0
    out["loadavg_1m_at_end"] = os.getloadavg()[0]
    out["total_seconds"] = round(time.perf_counter() - t0, 1)
    return out


def report(out: dict[str, Any]) -> None:
    rows = [[name, out[key]["median"], out[key]["p95"], out[key]["max"], out[key]["n"]]
            for name, key in (("one-shot wakeup lateness", "one_shot_lateness_ms"),
                              ("recurring wakeup lateness", "recurring_lateness_ms"),
                              ("plain turn", "plain_turn_ms"),
                              ("delegate round trip", "delegate_round_trip_ms"))]
    say("")
    say(table("Initiative (fake model, dev server)", ["what", "median ms", "p95 ms",
                                                     "max ms", "n"], rows))
    say(f"   one-shot p95 within 1 s: {out['one_shot_bar_p95_within_1s']}; delegate / "
        f"plain = {out['delegate_over_plain_median']}x (bar 3x: "
        f"{out['delegate_bar_within_3x']})")
    h = out["histories"]
    say(f"   per delegate round trip: {h['round_trip_events']:g} events, "
        f"{h['round_trip_workflow_tasks']:g} workflow tasks (parent "
        f"{h['parent_events_per_round_trip']:g} / {h['parent_workflow_tasks_per_round_trip']:g},"
        f" child {h['child_events']:g} / {h['child_workflow_tasks']:g}); plain turn "
        f"{h['plain_events_per_turn']:g} / {h['plain_workflow_tasks_per_turn']:g}")
    cpu = out["process_cpu_ms"]
    say(f"   CPU of this process: {cpu['plain_turn']} ms a plain turn, "
        f"{cpu['delegate_round_trip']} ms a round trip ({cpu['ratio']}x)")
    path = out["one_shot_fire_to_model_call"]
    say(f"   one-shot timer fired {out['one_shot_timer_late_ms']['median']} ms after its due "
        f"(median; p95 {out['one_shot_timer_late_ms']['p95']}), taken by the session "
        f"{out['one_shot_taken_late_ms']['median']} / {out['one_shot_taken_late_ms']['p95']} "
        "ms after; from the timer to the "
        f"model call: {path['workflow_tasks']} workflow tasks, {path['activities']} "
        "activities")
    say(f"   note: {out['load']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.25,
                        help="seconds after each plain turn and round trip")
    ns = parser.parse_args()
    if ns.quick:
        ns.sessions, ns.rounds, ns.turns = 2, 2, 3
    result = asyncio.run(main(ns))
    report(result)
    finish("initiative-quick" if ns.quick else "initiative", result)
