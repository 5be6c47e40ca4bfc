"""Three session worker processes on one task queue plus the vault worker (and a second
vault worker standing by), all on one Temporal and one PostgreSQL, each with a data folder
of its own as if on its own host. Sessions write a file each turn and read it back the next;
one session worker is SIGKILLed mid-way.

Asserted from the record and from the histories (ActivityTaskStarted's `identity` names the
worker process that ran each activity): reads and writes of one session ran on different
workers, every read saw the last write, every input is answered once, everything touching
the vault ran on the one vault worker (the daily transcript the model calls queue included),
and only its folder holds a vault (one history).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg
from temporalio.api.enums.v1 import EventType

from keel._queues import pollers
from keel.client import KeelClient
from schemas.config import KeelSettings
from tests.fake_anthropic import text_message, tool_use_message

SESSIONS = 6
TURNS = 4
_ASK = re.compile(r"\[(?P<sid>[\w-]+)\] turn (?P<k>\d+)")


def _file_turns(body: dict) -> dict:
    """Turn k: read notes.md, then write "<sid> v<k>" into it, then say the turn is done."""
    time.sleep(0.1)  # a model that takes a moment, so work overlaps and the kill lands
    last_ask, results = None, 0
    for message in body["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else []:
            if block.get("type") == "text" and message["role"] == "user":
                found = list(_ASK.finditer(block["text"]))
                if found:
                    last_ask, results = found[-1], 0
            elif block.get("type") == "tool_result":
                results += 1
    assert last_ask is not None
    sid, k = last_ask["sid"], int(last_ask["k"])
    if results == 0:
        return tool_use_message([("read_file", {"path": "notes.md"})])
    if results == 1:
        return tool_use_message([("write_file", {"path": "notes.md",
                                                 "content": f"{sid} v{k}"})])
    return text_message(f"turn {k} done")


def _start(role: str, env: dict[str, str], data_dir: Path, log: Path) -> subprocess.Popen:
    data_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "workers.main", role],
                            env={**env, "KEEL_DATA_DIR": str(data_dir)},
                            stdout=subprocess.DEVNULL, stderr=log.open("wb"))


def _vault_locks(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype='advisory'"
                           " AND classid=7246002 AND granted").fetchone()
        assert row is not None  # count(*) gives one row
        return row[0]


async def _wait_for_pollers(client, queue: str, pids: set[str]) -> None:
    """Until every session worker polls the queue for activities (they start at once)."""
    # Five Python processes importing Keel on two cores shared with the rest of the suite
    # (it runs in four processes): a CI run once saw them take over a minute.
    for _ in range(1800):
        found = await pollers(client, queue, activities=True)
        if pids <= {p.identity.split("@")[0] for p in found}:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the session workers never polled")


async def _histories(client, session_id: str) -> list:
    runs = [e async for e in client.list_workflows(f"WorkflowId = '{session_id}'")]
    return [await client.get_workflow_handle(session_id, run_id=r.run_id).fetch_history()
            for r in runs]


def _activities(histories) -> list[dict]:
    """Every started activity: its type, queue, worker identity and input."""
    out = []
    for history in histories:
        scheduled = {}
        for e in history.events:
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                a = e.activity_task_scheduled_event_attributes
                payloads = a.input.payloads
                scheduled[e.event_id] = {
                    "type": a.activity_type.name, "queue": a.task_queue.name,
                    "input": json.loads(payloads[0].data) if payloads else None}
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                a = e.activity_task_started_event_attributes
                out.append({**scheduled[a.scheduled_event_id], "identity": a.identity})
    return out


async def test_three_workers_and_the_vault_worker_share_one_session_state(
        temporal_env, database_url, fake_anthropic, tmp_path):
    fake_anthropic.responder = _file_turns
    queue = f"multi-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TEMPORAL_ADDRESS": temporal_env.client.service_client.config.target_host,
           "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": queue, "KEEL_VAULT_PUSH": "0",
           "ANTHROPIC_BASE_URL": fake_anthropic.base_url, "ANTHROPIC_API_KEY": "test"}
    vault = _start("vault", env, tmp_path / "vault-host", tmp_path / "vault.log")
    procs = [vault]
    try:
        for _ in range(200):
            if _vault_locks(database_url):
                break
            await asyncio.sleep(0.1)
        assert _vault_locks(database_url) == 1
        standby = _start("vault", env, tmp_path / "standby-host", tmp_path / "standby.log")
        procs.append(standby)
        workers = [_start("sessions", env, tmp_path / f"host-{i}", tmp_path / f"w{i}.log")
                   for i in range(3)]
        procs += workers
        await _wait_for_pollers(temporal_env.client, queue, {str(w.pid) for w in workers})
        keel = KeelClient(temporal_env.client, queue, KeelSettings.from_env(env))
        ids = [f"multi-{n}-{uuid.uuid4().hex[:6]}" for n in range(SESSIONS)]

        async def play(sid: str) -> list[str]:
            session = await keel.start_session(sid)
            replies = []
            for k in range(1, TURNS + 1):
                outcome = await asyncio.wait_for(session.ask(f"[{sid}] turn {k}"), 240)
                replies.append(outcome.reply_text)
            return replies

        def tool_results() -> dict[str, list[tuple[int, str]]]:
            with psycopg.connect(database_url) as conn:
                found = conn.execute("SELECT session_id, seq, content->>'tool' FROM messages"
                                     " WHERE type='tool_result' ORDER BY seq").fetchall()
            out: dict[str, list[tuple[int, str]]] = {}
            for sid, seq, tool in found:
                out.setdefault(sid, []).append((seq, tool))
            return out

        async def w0_holds_a_write_to_be_read() -> str | None:
            """A session whose newest tool result is a write worker 0 ran, with a read still
            to come: killed now, that read runs on another worker, so a write read back
            across workers is certain, not left to the scheduler (a session's activities
            follow its workflow's sticky worker). Checked again just before the kill."""
            for sid, results in tool_results().items():
                seq, tool = results[-1]
                if tool != "write_file" or len(results) >= 2 * TURNS:
                    continue
                started = _activities(await _histories(temporal_env.client, sid))
                if any(a["type"] == "run_tool" and a["input"]["result_seq"] == seq
                       and a["identity"].startswith(f"{workers[0].pid}@") for a in started):
                    return sid
            return None

        async def kill_one_mid_way() -> bool:
            # SIGKILL worker 0 while it holds a write a later turn reads; failing that (it
            # never did), near the end, and say so.
            total = SESSIONS * TURNS * 2
            while True:
                results = tool_results()
                sid = await w0_holds_a_write_to_be_read()
                if sid is not None and tool_results()[sid] == results.get(sid):
                    os.kill(workers[0].pid, signal.SIGKILL)
                    workers[0].wait()
                    return True
                if sum(map(len, results.values())) >= total - SESSIONS:
                    os.kill(workers[0].pid, signal.SIGKILL)
                    workers[0].wait()
                    return False
                await asyncio.sleep(0.05)

        killer = asyncio.create_task(kill_one_mid_way())
        replies = await asyncio.gather(*(play(sid) for sid in ids))
        killed_holding_a_write = await killer
        assert _vault_locks(database_url) == 1  # the stand-by never took a second one
        for _ in range(600):  # the last turns' transcripts, queued with their replies
            with psycopg.connect(database_url) as conn:
                if not conn.execute("SELECT count(*) FROM transcript_outbox").fetchone()[0]:
                    break
            await asyncio.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait(20)

    # Every input answered once, in order.
    assert replies == [[f"turn {k} done" for k in range(1, TURNS + 1)]] * SESSIONS
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT session_id, seq, type, content_text, content FROM messages"
            " ORDER BY session_id, seq").fetchall()
    for sid in ids:
        mine = [r for r in rows if r[0] == sid]
        assert [r[3] for r in mine if r[2] == "user"] == [
            f"[{sid}] turn {k}" for k in range(1, TURNS + 1)]
        finals = [r[3] for r in mine if r[2] == "assistant" and r[3].startswith("turn ")]
        assert finals == [f"turn {k} done" for k in range(1, TURNS + 1)]

    # Every read saw the last write, and the record names the version it saw.
    reads_checked = 0
    for sid in ids:
        results = [r for r in rows if r[0] == sid and r[2] == "tool_result"]
        reads = [r for r in results if r[4]["tool"] == "read_file"]
        writes = [r for r in results if r[4]["tool"] == "write_file"]
        assert len(reads) == len(writes) == TURNS
        assert reads[0][3] == "no file at 'notes.md'"
        for k in range(2, TURNS + 1):
            assert reads[k - 1][3] == f"{sid} v{k - 1}"
            assert reads[k - 1][4]["version"] == writes[k - 2][4]["version"] == k - 1
            reads_checked += 1
        with psycopg.connect(database_url) as conn:
            data, version = conn.execute(
                "SELECT data, version FROM workspace_files WHERE scope=%s AND path='notes.md'",
                (sid,)).fetchone()
        assert (bytes(data).decode(), version) == (f"{sid} v{TURNS}", TURNS)  # none twice

    # Which worker ran what, from the histories.
    started = [a for sid in ids for a in _activities(await _histories(temporal_env.client,
                                                                     sid))]
    pid_of = {f"{p.pid}@": name for p, name in zip(
        procs, ["vault", "standby", "w0", "w1", "w2"], strict=True)}

    def who(identity: str) -> str:
        return next(n for prefix, n in pid_of.items() if identity.startswith(prefix))

    per_worker = Counter(who(a["identity"]) for a in started)
    vault_runs = [a for a in started if a["queue"] == f"{queue}-vault"]
    assert {who(a["identity"]) for a in vault_runs} <= {"vault"}
    assert {who(a["identity"]) for a in started if a["queue"] == queue} <= {"w0", "w1", "w2"}
    assert per_worker["standby"] == 0
    assert all(per_worker[n] for n in ("w0", "w1", "w2"))  # w0 worked before it was killed
    # A file written on one worker and read back on another, in the same session.
    tool_runs = {(a["input"]["session_id"], a["input"]["result_seq"]): who(a["identity"])
                 for a in started if a["type"] == "run_tool"}
    crossings = 0
    for sid in ids:
        results = [r for r in rows if r[0] == sid and r[2] == "tool_result"]
        for before, after in itertools.pairwise(results):
            if (before[4]["tool"] == "write_file" and after[4]["tool"] == "read_file"
                    and tool_runs[(sid, before[1])] != tool_runs[(sid, after[1])]):
                crossings += 1
    assert crossings >= 1 or not killed_holding_a_write

    # One vault: only the vault worker's folder has one, with one line of history.
    assert (tmp_path / "vault-host" / "vault" / "CORE.md").exists()
    for host in ("standby-host", "host-0", "host-1", "host-2"):
        assert not (tmp_path / host / "vault").exists(), host
    roots = subprocess.run(["git", "-C", str(tmp_path / "vault-host" / "vault"), "rev-list",
                            "--max-parents=0", "--all"], capture_output=True, text=True)
    assert roots.returncode != 0 or len(roots.stdout.split()) <= 1
    assert "standing by" in (tmp_path / "standby.log").read_text()
    # The daily transcript the model calls queued, written by the vault worker (the only
    # folder with a vault): every message once, the outbox drained.
    daily = "".join(p.read_text() for p in
                    (tmp_path / "vault-host" / "vault" / "daily").glob("*.md"))
    assert all(daily.count(f"[{sid}] turn {k}") == 1
               for sid in ids for k in range(1, TURNS + 1))
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM transcript_outbox").fetchone()[0] == 0
    print(f"\nactivities per worker: {dict(sorted(per_worker.items()))}; "
          f"vault-queue activities: {len(vault_runs)}; reads checked: {reads_checked}; "
          f"write->read across workers: {crossings}; inputs answered: {SESSIONS * TURNS}; "
          f"worker w0 SIGKILLed "
          f"{'holding a write to be read' if killed_holding_a_write else 'near the end'}")
