"""Branching benchmark: fork, export and import of a long session with a big workspace.

    .venv/bin/python bench/bench_branch.py                     # ~1 min on 2 cores
    .venv/bin/python bench/bench_branch.py --rows 2000 --files 200 --runs 2   # quicker

A throwaway embedded stack (PostgreSQL, Temporal dev server) and a Keel worker with the
PostgreSQL workspace store. One session is seeded straight into the tables: 1,000 workspace
files (~2 KB each, every one in the file history), then 10,000 rows of record (user /
assistant with a tool call / its result / harness, ~60 words each) and one checkpoint near
the start (its recap row at seq 100, its cut at 90), and its workflow is started with the
state that points at that checkpoint. Then, each `--runs` times:

- fork at the newest seq (`KeelClient.fork`, end to end: the state query, the fork
  workflow, its one transaction copying ~9,900 rows and the 1,000 files, the new
  session's start); and a fork at seq 5,000 of the same session;
- export (`KeelClient.export_session`: the whole record, the checkpoint, the file history);
- import of that bundle into a fresh database under a fresh Temporal namespace
  (`KeelClient.import_session(trust=True)`, the session's workflow started there), then an
  export there, compared byte for byte with the first but for the end line's seal (each
  deployment seals with its own key).

With `--memory`, the session has long memory too: 100 cards its write_card calls wrote
(through the vault's own `apply_facts`, so each has its op) and a daily-note entry for
each of its user, assistant and harness rows, and the export and import are
`--with-memory` ones (the import into a fresh vault, which indexes what it writes).

Beside the fork end to end, its transaction alone (rolled back), so what Temporal adds on
a loaded machine shows apart from the database's share. Bars (at the median): a fork
≤ 2 s; export and import ≤ 10 s each; the round trip byte-exact in every run. Figures go to
stdout and bench/results/branch.json (branch-custom.json for other sizes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from google.protobuf.duration_pb2 import Duration  # noqa: E402
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402

from activities.db import apply_migrations  # noqa: E402
from bench.common import cancel_on_sigterm, percentile, table  # noqa: E402
from bench.stack import bench_stack, machine, say, write_json  # noqa: E402
from keel.client import KeelClient  # noqa: E402
from schemas.branch import unsealed  # noqa: E402
from schemas.config import KeelSettings, ModelSettings, WorkspaceStoreKind  # noqa: E402
from schemas.session import SESSION_WORKFLOW, SessionConfig, SessionInput, SessionState  # noqa: E402
from workers.worker import build_worker  # noqa: E402

WORDS = ("review the pull request in the queue oldest first and write the verdict to the "
         "reviews folder with the reasons and the files it touches").split()
TEXT = " ".join(WORDS[i % len(WORDS)] for i in range(60))
CHECKPOINT_SEQ, CUT_SEQ = 100, 90


def seed(database_url: str, session_id: str, rows: int, files: int) -> None:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO sessions (session_id, memory_scope) VALUES (%s, NULL)",
                     (session_id,))
        conn.execute(
            "INSERT INTO workspace_files (scope, path, version, data, size)"
            " SELECT %(s)s, 'src/file-' || g || '.md', 1, convert_to(repeat(%(t)s, 5), 'UTF8'),"
            " octet_length(repeat(%(t)s, 5)) FROM generate_series(1, %(n)s) g",
            {"s": session_id, "n": files, "t": TEXT + "\n"})
        # Four kinds of rows in turn: user, assistant with a tool call, its result, harness.
        conn.execute(
            "INSERT INTO messages (session_id, seq, input_id, type, source_line, content_text,"
            " content, token_count, turn)"
            " SELECT %(s)s, g, 'in-' || g,"
            "  CASE WHEN g = %(c)s THEN 'checkpoint'"
            "   ELSE (ARRAY['user','assistant','tool_result','harness'])[g %% 4 + 1] END,"
            "  CASE WHEN g %% 4 = 3 AND g <> %(c)s THEN '[Harness: Watch ci \"CI\"]' END,"
            "  'message ' || g || ': ' || %(text)s,"
            "  CASE WHEN g = %(c)s THEN jsonb_build_object('checkpoint_id', 'ckpt:' || %(s)s"
            "   || ':a1', 'kind', 'model', 'cut_seq', %(cut)s)"
            "   WHEN g %% 4 = 1 THEN jsonb_build_array(jsonb_build_object('type','text',"
            "   'text','x'), jsonb_build_object('type','tool_use','id','tu-' || g,'name',"
            "   'read_file','input', jsonb_build_object('path','prs/' || g || '.md')))"
            "   WHEN g %% 4 = 2 THEN jsonb_build_object('tool_use_id','tu-' || (g - 1),"
            "   'is_error',false) END, 80, g / 4"
            " FROM generate_series(1, %(n)s) g",
            {"s": session_id, "n": rows, "text": TEXT, "c": CHECKPOINT_SEQ, "cut": CUT_SEQ})
        conn.execute(
            "INSERT INTO checkpoints (checkpoint_id, session_id, kind, record_seq, cut_seq,"
            " upto_seq, mind_text, mind_context_text, memo, now_text, rendered,"
            " rendered_tokens, window_tokens_after) VALUES"
            " (%s, %s, 'model', %s, %s, %s, %s, %s, '[]', %s, %s, 400, 9000)",
            (f"ckpt:{session_id}:a1", session_id, CHECKPOINT_SEQ, CUT_SEQ, CHECKPOINT_SEQ - 1,
             "## Mission\n- " + TEXT, "## Mission\n- " + TEXT, "Current step: " + TEXT,
             "<recollection>" + TEXT + "</recollection>"))
        conn.execute("ANALYZE")


MEMORY_CARDS = 100


async def seed_memory(settings: KeelSettings, session_id: str, rows: int) -> int:
    """The session's cards (through the vault's writer) and its daily-note entries; the
    number of entries."""
    from datetime import UTC, datetime

    import psycopg

    from activities.vault.context import MemoryContext
    from activities.vault.files import atomic_write
    from schemas.vault.card import CardFact
    from schemas.vault.rollup import transcript_entry
    from schemas.vault.schema import CardOp

    ctx = MemoryContext(settings=settings, database_url=settings.database_url or "")
    vault = ctx.vault
    await asyncio.to_thread(vault.ensure)
    facts = [(f"tool:tu-{4 * i + 1}", CardFact(
        op=CardOp.ADD, type="project", title=f"Project {i}", field="status",
        value=f"review {i} is waiting on the verdict", description=TEXT[:80]))
        for i in range(MEMORY_CARDS)]
    today = datetime.now(UTC).date().isoformat()
    await vault.apply_facts(await ctx.pool(), facts, today)
    speakers = {0: "user", 1: "assistant", 3: "harness"}  # g % 4, as the seed types them
    now = datetime.now(UTC)
    entries = [transcript_entry(session_id, g, now, speakers[g % 4], f"message {g}: {TEXT}")
               for g in range(1, rows + 1) if g % 4 in speakers and g != CHECKPOINT_SEQ]
    rel = f"daily/{today}.md"
    atomic_write(vault.path(rel), f"# {today}\n" + "".join(entries))
    with psycopg.connect(settings.database_url or "", autocommit=True) as conn:
        conn.execute("UPDATE sessions SET memory_scope = 'default' WHERE session_id = %s",
                     (session_id,))
    async with ctx.connection() as conn:
        await vault.index_file(conn, rel)
    return len(entries)


def origin_state(session_id: str, rows: int) -> SessionState:
    """The state a session with this record would carry: its window at the checkpoint."""
    # The last row must not be inside a tool round: rows end on a harness row (g % 4 = 3)
    # or a result; the seed keeps `rows` a multiple of 4.
    return SessionState(session_id=session_id, config=SessionConfig(memory_scope=None),
                        next_seq=rows + 1, recorded_upto=rows, turn=rows // 4,
                        window_start_seq=CUT_SEQ, checkpoint_id=f"ckpt:{session_id}:a1",
                        checkpoint_count=1, checkpoint_attempts=1, mind_text="## Mission")


async def other_namespace(client: Client) -> Client:
    namespace = f"bench-other-{uuid.uuid4().hex[:6]}"
    await client.workflow_service.register_namespace(RegisterNamespaceRequest(
        namespace=namespace, workflow_execution_retention_period=Duration(seconds=24 * 3600)))
    for _ in range(100):
        try:
            other = await Client.connect(client.service_client.config.target_host,
                                         namespace=namespace,
                                         data_converter=pydantic_data_converter)
            await other.count_workflows()
            return other
        except Exception:
            await asyncio.sleep(0.2)
    raise RuntimeError("the other namespace never answered")


def fresh_database(database_url: str) -> str:
    import psycopg

    name = f"bench_other_{uuid.uuid4().hex[:8]}"
    # The embedded stack's URL names its admin database: postgresql://...@/postgres?host=
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = database_url.replace("/postgres?", f"/{name}?", 1)
    apply_migrations(url)
    return url


def timed(values: list[float]) -> dict[str, Any]:
    return {"median_s": round(percentile(values, 50), 3),
            "p90_s": round(percentile(values, 90), 3), "max_s": round(max(values), 3),
            "runs": len(values), "each_s": [round(v, 3) for v in values]}


async def copy_only(database_url: str, state: SessionState) -> float:
    """The fork's transaction alone (activities.branch.fork_copy), rolled back: the
    database's share of a fork."""
    import psycopg

    from activities.branch import fork_copy
    from schemas.branch import ForkCopy

    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        t0 = time.perf_counter()
        async with conn.transaction(force_rollback=True):
            await fork_copy(conn, ForkCopy(
                request_id=uuid.uuid4().hex, origin=state.session_id,
                new_session=f"{state.session_id}-probe", origin_state=state), versions=True)
        return time.perf_counter() - t0


async def one_round(keel: KeelClient, client: Client, settings: KeelSettings,
                    session_id: str, rows: int, out: dict[str, list[float]],
                    memory: bool = False) -> bool:
    out["fork's transaction alone (newest seq)"].append(
        await copy_only(settings.database_url or "", origin_state(session_id, rows)))
    t0 = time.perf_counter()
    done = await keel.fork(session_id)
    out["fork at the newest seq"].append(time.perf_counter() - t0)
    assert done.files_copied > 0 and done.rows_copied >= rows - CUT_SEQ
    t0 = time.perf_counter()
    await keel.fork(session_id, at_seq=rows // 2)
    out["fork at the middle seq"].append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    bundle = await keel.export_session(session_id, with_memory=memory)
    out["export"].append(time.perf_counter() - t0)
    out["bundle_bytes"] = [float(len(bundle))]
    elsewhere = settings.data_dir / f"other-{uuid.uuid4().hex[:6]}"
    there = settings.model_copy(update={
        "database_url": fresh_database(settings.database_url or ""),
        "task_queue": f"{settings.task_queue}-b", "data_dir": elsewhere,
        "memory": settings.memory.model_copy(update={"vault_dir": elsewhere / "vault"})})
    other_client = await other_namespace(client)
    async with build_worker(other_client, there):
        other = KeelClient(other_client, there.task_queue, there)
        t0 = time.perf_counter()
        await other.import_session(bundle, trust=True)  # a deployment of one's own
        out["import"].append(time.perf_counter() - t0)
        again = await other.export_session(session_id, with_memory=memory)
    return unsealed(again) == unsealed(bundle)  # each deployment seals with its own key


async def main(args: argparse.Namespace) -> dict[str, Any]:
    cancel_on_sigterm()
    out: dict[str, Any] = {
        "benchmark": "branch", "machine": machine(), "rows": args.rows, "files": args.files,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    session_id = f"bench-branch-{uuid.uuid4().hex[:6]}"
    async with bench_stack(ModelSettings()) as (client, settings):
        settings = settings.model_copy(update={
            "workspace_store": WorkspaceStoreKind.POSTGRES})
        t0 = time.perf_counter()
        seed(settings.database_url or "", session_id, args.rows, args.files)
        out["seed_seconds"] = round(time.perf_counter() - t0, 1)
        say(f"seeded {args.rows:,} rows and {args.files:,} files in {out['seed_seconds']} s")
        state = origin_state(session_id, args.rows)
        if args.memory:
            t0 = time.perf_counter()
            out["memory"] = {"cards": MEMORY_CARDS, "daily_entries": await seed_memory(
                settings, session_id, args.rows)}
            out["memory"]["seed_seconds"] = round(time.perf_counter() - t0, 1)
            say(f"seeded memory: {out['memory']}")
            state.config = state.config.model_copy(update={"memory_scope": "default"})
        async with build_worker(client, settings):
            keel = KeelClient(client, settings.task_queue, settings)
            await client.start_workflow(
                SESSION_WORKFLOW, SessionInput(session_id=session_id, config=state.config,
                                               state=state),
                id=session_id, task_queue=settings.task_queue)
            times: dict[str, list[float]] = {k: [] for k in (
                "fork's transaction alone (newest seq)", "fork at the newest seq",
                "fork at the middle seq", "export", "import")}
            exact = []
            for i in range(args.runs):
                exact.append(await one_round(keel, client, settings, session_id, args.rows,
                                             times, args.memory))
                say(f"  run {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s"
                                                     for k, v in times.items()
                                                     if k != "bundle_bytes"))
    out["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out["bundle_bytes"] = int(times.pop("bundle_bytes")[0])
    out["timings"] = {k: timed(v) for k, v in times.items()}
    out["round_trip_byte_exact"] = all(exact)
    # The bars hold at the median; the p90 and max show what the loaded machine added.
    med = {k: v["median_s"] for k, v in out["timings"].items()}
    out["bars"] = {
        "fork <= 2 s (median)": max(med["fork at the newest seq"],
                                    med["fork at the middle seq"]) <= 2,
        "export <= 10 s (median)": med["export"] <= 10,
        "import <= 10 s (median)": med["import"] <= 10,
        "round trip byte-exact (every run)": all(exact)}
    return out


def report(out: dict[str, Any]) -> None:
    say("")
    say(table(f"Branching a session of {out['rows']:,} rows and {out['files']:,} files "
              f"(bundle {out['bundle_bytes']:,} bytes)", ["step", "median s", "p90 s",
                                                          "max s"],
              [[k, v["median_s"], v["p90_s"], v["max_s"]]
               for k, v in out["timings"].items()]))
    say(f"\nround trip byte-exact: {out['round_trip_byte_exact']}; bars: "
        + ", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in out["bars"].items()))


def cli() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--files", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--memory", action="store_true",
                        help="The session has cards and daily notes; export them too.")
    args = parser.parse_args()
    if args.rows % 4:
        parser.error("--rows must be a multiple of 4 (the record ends after a tool round)")
    out = asyncio.run(main(args))
    report(out)
    name = "branch" if (args.rows, args.files) == (10_000, 1_000) else "branch-custom"
    name += "-memory" if args.memory else ""
    say(f"\nwritten to {write_json(name, out)}")


if __name__ == "__main__":
    cli()
