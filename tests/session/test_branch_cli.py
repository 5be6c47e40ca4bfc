"""`keel fork`, `keel rewind`, `keel export` and `keel import` against a running worker:
each says what it did in one line, and a refusal in one line with exit 1."""

from __future__ import annotations

import asyncio
import gzip
import re
import uuid

from typer.testing import CliRunner

from keel.branching import seal_public_key
from keel.cli import app
from tests.harness import keel_worker, small_config
from tests.session.branching import notes, settings  # noqa: F401


async def test_the_branch_commands(client, settings, fake_anthropic, database_url,  # noqa: F811
                                   tmp_path):
    env = {"TEMPORAL_ADDRESS": client.service_client.config.target_host,
           "DATABASE_URL": database_url, "KEEL_TASK_QUEUE": settings.task_queue,
           "KEEL_DATA_DIR": str(tmp_path / "cli"), "COLUMNS": "200"}

    def keel(*args: str, code: int = 0) -> str:
        result = CliRunner().invoke(app, list(args), env=env)
        assert result.exit_code == code, (args, result.output, result.exception)
        return " ".join(result.output.split())

    async with keel_worker(client, settings) as kc:
        session = await kc.start_session(
            f"cli-{uuid.uuid4().hex[:8]}", config=small_config(settings, memory_scope=None))
        sid = session.session_id
        await session.ask("write one")  # #1 to #4
        await session.ask("write two")  # #5 to #8
        out = await asyncio.to_thread(keel, "fork", sid, "--at", "4", "--id", f"{sid}-f")
        assert f"forked {sid}-f from {sid} at seq 4: 4 row(s), 1 file(s)" in out
        assert await notes(kc.session(f"{sid}-f")) == "one"
        refused = await asyncio.to_thread(keel, "rewind", sid, "--to", "6", code=1)
        assert "inside a tool round" in refused
        out = await asyncio.to_thread(keel, "rewind", sid, "--to", "4")
        assert f"rewound {sid} to seq 4: 4 row(s) marked rewound (#5 to #8)" in out
        listing = await asyncio.to_thread(keel, "record", sid)
        assert listing.count("(rewound)") == 4
        forked = await asyncio.to_thread(keel, "record", f"{sid}-f", "--json")
        assert forked.count(f'"origin": {{"session": "{sid}"') == 4
        bundle = tmp_path / "s.keel"
        out = await asyncio.to_thread(keel, "export", sid, "-o", str(bundle))
        assert f"exported {sid} to" in out and bundle.stat().st_size > 0
        out = await asyncio.to_thread(keel, "import", str(bundle), "--id", f"{sid}-i")
        assert f"imported {sid}-i: 8 row(s), 0 checkpoint(s)" in out
        assert out.endswith("the bundle was sealed by this deployment; it has no long memory")
        # The public key another deployment lists to take this one's bundles as its own.
        key = await asyncio.to_thread(keel, "seal-key")
        assert re.fullmatch("[0-9a-f]{64}", key) and key == await seal_public_key(kc)
        assert await notes(kc.session(f"{sid}-i")) == "one"
        # Changed since it was sealed: said so; with --agent the session goes on with it.
        changed = tmp_path / "changed.keel"
        changed.write_bytes(gzip.compress(gzip.decompress(bundle.read_bytes()).replace(
            b"write one", b"write ONE")))
        (tmp_path / "agent.toml").write_text('instructions = "Answer in one line."\n')
        out = await asyncio.to_thread(keel, "import", str(changed), "--id", f"{sid}-c",
                                      "--agent", str(tmp_path / "agent.toml"))
        assert out.endswith("the bundle was changed since this deployment sealed it; it "
                            f"goes on with the agent of {tmp_path / 'agent.toml'}; it has "
                            "no long memory")
        agent = await kc.session(f"{sid}-c").agent()
        assert agent is not None and agent.instructions == "Answer in one line."
        out = await asyncio.to_thread(keel, "import", str(changed), "--id", f"{sid}-t",
                                      "--trust")
        assert out.endswith("changed since this deployment sealed it; taken as this "
                            "deployment's own (--trust); it has no long memory")
        # In a memory scope the importer names, not the bundle's.
        out = await asyncio.to_thread(keel, "import", str(bundle), "--id", f"{sid}-s",
                                      "--memory-scope", "team-b")
        assert out.endswith("; its long memory is scope 'team-b'")
        assert (await kc.session(f"{sid}-s").state()).config.memory_scope == "team-b"
        refused = await asyncio.to_thread(keel, "import", str(bundle), "--id", f"{sid}-x",
                                          "--memory-scope", "Team B", code=1)
        assert "'Team B' is not a valid scope id" in refused
        refused = await asyncio.to_thread(keel, "import", str(bundle), "--id", f"{sid}-f",
                                          code=1)
        assert "exists already" in refused
