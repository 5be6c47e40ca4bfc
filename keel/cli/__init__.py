"""The `keel` command line: run the stack and a worker, drive and inspect sessions.

A thin shell over the public client, as httpx's command line is over httpx: every command
calls `keel.client`, `keel.record`, `keel.devstack`, `keel.demo` or `keel.ui` and renders
what comes back; no session logic lives here, and no SQL. Commands other than `dev`,
`worker` and `demo` find Temporal through TEMPORAL_ADDRESS or the stack file `keel dev`
writes under KEEL_DATA_DIR.

The commands live by concern: `serving` (dev, worker, demo, ui), `sessions` (start, send,
signal, status, mind, memo, now, list, end, compact), `initiative` (wakeups), `approvals`,
`budget` (budget, interrupt), `chat`, `history` (record, replay, tail), `branch` (fork,
rewind, export, import), `files`, `vault`; `shell` holds what they all stand on. They are
registered here, in the order `keel --help` lists them.
"""

from __future__ import annotations

from keel.cli import (
    approvals,
    branch,
    budget,
    chat,
    files,
    history,
    initiative,
    serving,
    sessions,
)
from keel.cli.shell import KeelApp
from keel.cli.vault import vault_app

__all__ = ["app"]

app = KeelApp(
    name="keel",
    help="Keel: long AI agent sessions that do not forget (Temporal + PostgreSQL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command()(serving.dev)
app.command()(serving.worker)
app.command()(serving.demo)
app.command(name="ui")(serving.ui_command)
app.command()(sessions.start)
app.command()(approvals.pending)
app.command()(approvals.approve)
app.command()(approvals.deny)
app.command()(budget.budget)
app.command()(budget.interrupt)
app.command(name="list")(sessions.list_)
app.command()(sessions.end)
app.command()(sessions.compact)
app.command()(sessions.send)
app.command(name="signal")(sessions.signal_)
app.command()(sessions.status)
app.command()(initiative.wakeups)
app.command(name="mind")(sessions.query_command("mind"))
app.command(name="memo")(sessions.query_command("memo"))
app.command(name="now")(sessions.query_command("now"))
app.command()(history.record)
app.command()(files.files)
app.command()(files.put)
app.command()(history.replay)
app.command()(branch.fork)
app.command()(branch.rewind)
app.command()(branch.export)
app.command(name="import")(branch.import_)
app.command(name="seal-key")(branch.seal_key)
app.command()(branch.delete)
app.command()(chat.chat)
app.command()(history.tail)
app.add_typer(vault_app, name="vault")
