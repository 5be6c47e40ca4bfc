"""Parts b and c of bench_runtime: what a long record costs. A model call's rebuild must
follow the live window, not the record, and a session's workflow history must stay bounded
(continue-as-new) however many turns it runs."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from psycopg import AsyncConnection
from temporalio.client import Client

from activities.context import SessionContext
from activities.db import get_pool
from bench.common import percentile, table
from bench.stack import ask_resilient, ms, say, wait_idle
from keel.client import KeelClient, session_config
from schemas.config import KeelSettings
from schemas.context import assemble_messages
from schemas.tokens import count_tokens
from tests.fake_anthropic import FakeAnthropic, text_message
from workers.worker import model_backends

LIVE_WINDOW_ROWS = 40


# ----- b. context rebuild ------------------------------------------------------------------

_FILES = ["services/billing/invoice.py", "services/auth/tokens.py", "docs/runbook.md",
          "services/search/ranking.py", "tests/test_retry.py"]


def synthetic_rows(session_id: str, count: int) -> list[tuple[Any, ...]]:
    """`count` rows in a realistic rhythm: user, assistant tool call, tool result, reply."""
    rows: list[tuple[Any, ...]] = []
    seq = 0
    turn = 0
    while seq < count:
        turn += 1
        path = _FILES[turn % len(_FILES)]
        tool_id = f"toolu_{turn:07d}"
        user = (f"Turn {turn}: please look at {path} and tell me whether the retry logic "
                f"handles the {['timeout', 'duplicate', 'partial write'][turn % 3]} case.")
        call_text = f"Reading {path} to check the retry path."
        call_blocks = [{"type": "text", "text": call_text},
                       {"type": "tool_use", "id": tool_id, "name": "read_file",
                        "input": {"path": path}}]
        result = "\n".join(f"{i:>4}  def handle_{turn}_{i}(item): return retry(item, attempts={i})"
                           for i in range(1, 9))
        reply = (f"In {path} the retry wraps each item with a bounded number of attempts; "
                 f"the case from turn {turn} is handled by handle_{turn}_3. No change needed.")
        parts: list[tuple[str, str, str | None, int]] = [
            ("user", user, None, count_tokens(user)),
            ("assistant", call_text, json.dumps(call_blocks),
             count_tokens(call_text + " " + json.dumps({"path": path}))),
            ("tool_result", result, json.dumps({"tool_use_id": tool_id, "is_error": False,
                                                "tool": "read_file"}), count_tokens(result)),
            ("assistant", reply, json.dumps([{"type": "text", "text": reply}]),
             count_tokens(reply)),
        ]
        for kind, text, content, tokens in parts:
            seq += 1
            if seq > count:
                break
            rows.append((session_id, seq, f"{kind}-{seq}", kind, None, text, content,
                         tokens, turn))
    return rows


async def seed_session(conn: AsyncConnection, session_id: str, count: int) -> float:
    """Bulk-load a session (sessions row, COPY of its messages, one checkpoint)."""
    t0 = time.perf_counter()
    await conn.execute("INSERT INTO sessions (session_id) VALUES (%s)", (session_id,))
    rows = synthetic_rows(session_id, count)
    async with conn.cursor() as cur, cur.copy(
            "COPY messages (session_id, seq, input_id, type, source_line, content_text,"
            " content, token_count, turn) FROM STDIN") as copy:
        for row in rows:
            await copy.write_row(row)
    cut = count - LIVE_WINDOW_ROWS + 1
    rendered = "<recollection>\n" + "\n".join(
        f"- remembered fact {i}: the retry path of module_{i % 7} is bounded" for i in
        range(150)) + "\n</recollection>\n"
    await conn.execute(
        "INSERT INTO checkpoints (checkpoint_id, session_id, kind, record_seq, cut_seq,"
        " upto_seq, mind_text, mind_context_text, memo, now_text, rendered, rendered_tokens,"
        " carried_seqs) VALUES (%s,%s,'model',%s,%s,%s,'','','[]','',%s,%s,'[]')",
        (f"ckpt:{session_id}", session_id, cut - 1, cut, cut - 1, rendered,
         count_tokens(rendered)))
    return time.perf_counter() - t0


async def bench_rebuild(settings: KeelSettings, sizes: Sequence[int],
                        runs: int) -> dict[str, Any]:
    assert settings.database_url
    pool = await get_pool(settings.database_url)
    context = SessionContext(settings, model=model_backends())
    sessions = {n: f"rebuild-{n}-{uuid.uuid4().hex[:6]}" for n in sizes}
    seeded: dict[int, float] = {}
    async with pool.connection() as conn:
        for n, sid in sessions.items():
            seeded[n] = await seed_session(conn, sid, n)
        await conn.execute("ANALYZE messages")
        await conn.execute("ANALYZE checkpoints")

    async def rebuild(n: int) -> tuple[float, int, int]:
        sid = sessions[n]
        t0 = time.perf_counter()
        async with pool.connection() as conn:
            window = await context.windows.load(
                conn, sid, n - LIVE_WINDOW_ROWS + 1, n, f"ckpt:{sid}")
        messages, _ = assemble_messages(window.rows, checkpoint_text=window.checkpoint_text)
        return time.perf_counter() - t0, len(window.rows), len(messages)

    times: dict[int, list[float]] = {n: [] for n in sizes}
    shape: dict[int, tuple[int, int]] = {}
    for _ in range(3):
        for n in sizes:
            await rebuild(n)
    for _ in range(runs):  # interleaved, so drift hits every size alike
        for n in sizes:
            seconds, rows, messages = await rebuild(n)
            times[n].append(seconds)
            shape[n] = (rows, messages)

    # For contrast only: what a rebuild that followed the whole record would cost.
    from activities.record import load_rows

    big = max(sizes)
    full: list[float] = []
    for _ in range(3):
        t0 = time.perf_counter()
        async with pool.connection() as conn:
            loaded = await load_rows(conn, sessions[big], 1, big)
        assemble_messages(loaded)
        full.append(time.perf_counter() - t0)

    small = min(sizes)
    per_size = {
        str(n): {"recorded_messages": n, "seed_seconds": round(seeded[n], 2),
                 "window_rows": shape[n][0], "api_messages": shape[n][1],
                 "median_ms": ms(statistics.median(times[n])),
                 "p90_ms": ms(percentile(times[n], 90)), "runs": runs}
        for n in sizes}
    ratio = statistics.median(times[big]) / statistics.median(times[small])
    return {
        "live_window_rows": LIVE_WINDOW_ROWS, "sizes": per_size,
        "ratio_large_over_small": round(ratio, 2), "record_ratio": big // small,
        "full_record_load_median_ms": ms(statistics.median(full)),
        "full_record_load_rows": big,
    }


def report_rebuild(b: dict[str, Any]) -> None:
    say("")
    rows: list[list[object]] = [
        [f"{int(s['recorded_messages']):,}", s["window_rows"], s["median_ms"], s["p90_ms"],
         s["runs"]] for s in b["sizes"].values()]
    say(table(
        f"b. Context rebuild: load_window (live window of the last {b['live_window_rows']} "
        "rows + checkpoint) + assemble_messages",
        ["recorded messages", "window rows", "median ms", "p90 ms", "runs"], rows))
    growth = b["ratio_large_over_small"]
    verdict = "follows the live window" if growth < 3 else "GROWS WITH THE RECORD"
    say(f"   record grew {b['record_ratio']:,}x; rebuild time grew {growth}x -> {verdict}")
    say(f"   (for contrast: loading and assembling the whole {b['full_record_load_rows']:,}-row "
        f"record takes {b['full_record_load_median_ms']} ms)")


# ----- c. workflow history -----------------------------------------------------------------

async def walk_runs(client: Client, session_id: str, first_run_id: str) -> list[dict[str, Any]]:
    """Every run of the session, first to current, following continue-as-new events."""
    runs: list[dict[str, Any]] = []
    run_id: str | None = first_run_id
    while run_id:
        handle = client.get_workflow_handle(session_id, run_id=run_id)
        history = await handle.fetch_history()
        desc = await handle.describe()
        info = desc.raw_description.workflow_execution_info
        runs.append({"run_id": run_id, "events": len(history.events),
                     "history_size_bytes": info.history_size_bytes,
                     "status": desc.status.name if desc.status else "?"})
        last = history.events[-1] if history.events else None
        run_id = None
        if last is not None and last.HasField(
                "workflow_execution_continued_as_new_event_attributes"):
            continued = last.workflow_execution_continued_as_new_event_attributes
            run_id = continued.new_execution_run_id
    return runs


async def listed_runs(client: Client, session_id: str, expect: int) -> int:
    """Runs that Temporal's visibility lists for the id (it can lag a little)."""
    found = 0
    for _ in range(25):
        found = 0
        async for _wf in client.list_workflows(f"WorkflowId = '{session_id}'"):
            found += 1
        if found >= expect:
            break
        await asyncio.sleep(0.2)
    return found


async def bench_history(client: Client, settings: KeelSettings, fake: FakeAnthropic,
                        turns: int, limit: int,
                        progress: Callable[[str], None]) -> dict[str, Any]:
    fake.reset(lambda body: text_message("ok"))
    keel = KeelClient(client, settings.task_queue, settings)
    session_id = f"bench-history-{limit}-{uuid.uuid4().hex[:6]}"
    session = await keel.start_session(session_id, config=session_config(
        settings, continue_as_new_after_events=limit))
    first_run_id = session.handle.first_execution_run_id or session.handle.result_run_id
    assert first_run_id
    errors: list[str] = []
    times: list[float] = []
    started = time.perf_counter()
    for i in range(turns):
        t0 = time.perf_counter()
        outcome = await ask_resilient(session, f"turn {i}", errors)
        times.append(time.perf_counter() - t0)
        if outcome.error:
            errors.append(f"turn {i}: {outcome.error}")
        if (i + 1) % 250 == 0:
            progress(f"    {i + 1}/{turns} turns, {time.perf_counter() - started:.0f} s")
    wall = time.perf_counter() - started
    await wait_idle(session)
    status = await session.status()
    current = await session.handle.describe()
    runs = await walk_runs(client, session_id, first_run_id)
    listed = await listed_runs(client, session_id, len(runs))
    return {
        "continue_as_new_after_events": limit, "turns": turns, "status_turn": status.turn,
        "wall_seconds": round(wall, 1), "per_turn_ms": ms(wall / turns),
        "ask_median_ms": ms(statistics.median(times)),
        "ask_p90_ms": ms(percentile(times, 90)),
        "current_run_history_length": current.raw_description.workflow_execution_info
        .history_length,
        "runs": len(runs), "continue_as_new_count": len(runs) - 1,
        "runs_listed_by_visibility": listed,
        "max_run_history_length": max(r["events"] for r in runs),
        "max_run_history_bytes": max(r["history_size_bytes"] for r in runs),
        "events_per_turn": round(sum(r["events"] for r in runs) / turns, 1),
        "run_lengths": [r["events"] for r in runs],
        "errors": errors,
    }


def report_history(history: list[dict[str, Any]]) -> None:
    say("")
    hist_rows = [[h["continue_as_new_after_events"] or "0 (Temporal's suggestion only)",
                  h["turns"], h["current_run_history_length"], h["runs"],
                  h["max_run_history_length"], f"{h['max_run_history_bytes']:,}",
                  h["events_per_turn"], h["per_turn_ms"], h["ask_median_ms"],
                  len(h["errors"])] for h in history]
    say(table("c. Workflow history after the turns (fake model answering at once)",
              ["continue_as_new_after_events", "turns", "current run events", "runs",
               "max run events", "max run bytes", "events/turn", "wall ms/turn",
               "ask median ms", "errors"], hist_rows))
    for h in history:
        say(f"   limit {h['continue_as_new_after_events']}: run lengths {h['run_lengths']}; "
            f"visibility lists {h['runs_listed_by_visibility']} run(s)")
        for err in h["errors"][:5]:
            say(f"   error: {err}")
