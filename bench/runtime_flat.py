"""Part d of bench_runtime: a turn's cost must stay flat as the day's transcript and the
workspace grow, so each is measured at a small and a large size, alternately, and the steps
that could grow are timed on their own."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from psycopg import AsyncConnection
from temporalio.client import Client

from activities.context import SessionContext
from activities.db import get_pool
from bench.common import percentile, table
from bench.stack import ms, say, wait_idle
from keel.client import KeelClient, SessionHandle, session_config
from schemas.config import KeelSettings
from tests.fake_anthropic import FakeAnthropic, text_message
from workers.worker import model_backends

# ----- d. flat cost: the day's transcript and the workspace ---------------------------------

_TOPICS = ["billing", "auth", "search", "deploy", "runbook", "retry", "cache", "queue"]


async def seed_day(settings: KeelSettings, scope: str, entries: int) -> float:
    """Today's transcript of `scope` with `entries` entries of other sessions, indexed."""
    from activities.vault.context import MemoryContext
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
    from activities.vault.context import MemoryContext
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
