"""The session commands: start, send, signal, status, mind / memo / now, list, end, compact.

Invariants: each is a call or two on `keel.client` and a rendering of what it returns; the
session decides everything (what is recorded, refused, checkpointed). A command that waits
on a worker goes through `needs_worker`, so it never hangs on a queue nobody serves.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from keel.cli.files import attachment_names, put_attachments
from keel.cli.initiative import wakeup_when
from keel.cli.shell import connect, given_text, load_settings, run, session_handle
from keel.cli.waiting import needs_worker, say
from keel.client import SessionHandle, session_config
from keel.console import ago, console, error, key_values, one_line, working
from keel.live import LiveView, model_label
from schemas.agent import AgentSpec, spec_from_text
from schemas.cache_ttl import CacheTtl
from schemas.config import KeelSettings
from schemas.interrupt import InterruptPolicy
from schemas.model import OFFLINE_MODEL_NAME
from schemas.session import SessionConfig, SessionStatus, SessionSummary
from schemas.vault.scope import ScopeError, check_scope

__all__ = ["QUERIES", "MemoryScopeOption", "NoMemoryOption", "SignalKind", "compact",
           "compact_line", "end", "list_", "memory_config", "query_command", "read_agent_spec",
           "scope_said", "send", "session_tree", "signal_", "start", "state_text", "status",
           "status_table"]


def start(
    session_id: Annotated[str | None, typer.Argument(help="Session id (default: new).")
                          ] = None,
    text: Annotated[str | None, typer.Argument(
        help="The first message (or --message); - reads it from standard input.")] = None,
    id: Annotated[str | None, typer.Option("--id", help="Session id (default: new).")] = None,
    message: Annotated[str | None, typer.Option("--message", "-m",
                                                help="First message.")] = None,
    agent: Annotated[Path | None, typer.Option(
        "--agent", help="The agent spec: a TOML or JSON file.")] = None,
    instructions: Annotated[Path | None, typer.Option(
        "--instructions", help="A text file with the agent's instructions.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="The model's name.")] = None,
    fallback_model: Annotated[str | None, typer.Option(
        "--fallback-model", help="Asked instead of the model from a call's third attempt on "
        "(overloaded, rate-limited, a server error).")] = None,
    cache_ttl: Annotated[CacheTtl | None, typer.Option(
        "--cache-ttl", help="How long the prompt cache keeps the context (default: auto).")
                         ] = None,
    memory_scope: MemoryScopeOption = None,
    no_memory: NoMemoryOption = False,
    attach: AttachOption = None,
) -> None:
    """Start a session, optionally with its first message (acknowledged in the same call)."""
    if text is not None and message is not None:
        error("the first message is given twice (TEXT and --message): give it once")
        raise typer.Exit(2)
    message = message if text is None else text
    if attach and message is None:
        error("--attach sends files with the first message: give the message too")
        raise typer.Exit(2)
    spec = read_agent_spec(agent, instructions, model, cache_ttl, fallback_model)

    async def main(message: str | None) -> None:
        message = None if message is None else given_text(message)
        settings = load_settings()
        config = memory_config(settings, memory_scope, no_memory)
        keel = await connect(settings)
        sid = session_id or id
        if message is None:
            handle = await keel.start_session(sid, config=config, agent=spec)
            console.print(f"started session [bold]{escape(handle.session_id)}[/]"
                          f"{scope_said(config)}")
            return
        sid = sid or f"session-{uuid.uuid4().hex[:12]}"
        joined = await keel.session(sid).is_running()
        if attach:  # refused before anything starts; put in the store directly, as send's
            attachment_names(settings, attach)
            handle = await keel.start_or_join(sid, config=config, agent=spec)
            files = await put_attachments(settings, sid, attach)
            accepted = await needs_worker(handle, handle.send(message, attachments=files))
        else:
            handle, accepted = await keel.start_with_message(sid, message, config=config,
                                                             agent=spec)
        verb = "joined" if joined else "started"
        console.print(f"{verb} session [bold]{escape(handle.session_id)}[/]"
                      f"{'' if joined else scope_said(config)}; message recorded as seq "
                      f"{accepted.seq}")
    run(main(message))


AttachOption = Annotated[list[Path] | None, typer.Option(
    "--attach", "-a", exists=True, dir_okay=False,
    help="A local file sent with it: an image (PNG, JPEG, GIF, WebP), a PDF or text. "
    "Again for more.")]
AttachWorkspaceOption = Annotated[list[str] | None, typer.Option(
    "--attach-workspace", help="A file of the session's workspace sent with it. Again for "
    "more.")]
MemoryScopeOption = Annotated[str | None, typer.Option(
    "--memory-scope", help="Whose long memory a new session reads and writes (a scope id; "
    "default: default).", show_default=False)]
NoMemoryOption = Annotated[bool, typer.Option(
    "--no-memory", help="A new session without long memory.")]


def memory_config(settings: KeelSettings, scope: str | None,
                  no_memory: bool) -> SessionConfig | None:
    """A new session's config with its memory scope (`--memory-scope`, `--no-memory`), or
    None for the settings' default; a scope id that cannot be one is said and exits 2."""
    if no_memory:
        if scope is not None:
            error("give --memory-scope or --no-memory, not both")
            raise typer.Exit(2)
        return session_config(settings, memory_scope=None)
    if scope is None:
        return None
    try:
        return session_config(settings, memory_scope=check_scope(scope))
    except ScopeError as err:
        error(str(err))
        raise typer.Exit(2) from None


def scope_said(config: SessionConfig | None) -> str:
    """How a start names a scope it was given: " (memory scope acme)", " (no long memory)"."""
    if config is None:
        return ""
    scope = config.memory_scope
    return f" (memory scope {escape(scope)})" if scope else " (no long memory)"


def read_agent_spec(agent: Path | None, instructions: Path | None = None,
                    model: str | None = None, cache_ttl: CacheTtl | None = None,
                    fallback_model: str | None = None) -> AgentSpec | None:
    """The spec from `--agent`, with `--instructions`, `--model`, `--cache-ttl` and
    `--fallback-model` on top."""
    if agent is None and instructions is None and model is None and cache_ttl is None \
            and fallback_model is None:
        return None
    try:
        spec = spec_from_text(agent.read_text(), agent.suffix) if agent else AgentSpec()
        if instructions is not None:
            spec = spec.model_copy(update={"instructions": instructions.read_text()})
    except (OSError, ValueError) as err:
        error(f"the agent spec cannot be read: {one_line(str(err))}")
        raise typer.Exit(1) from None
    if model:
        spec = spec.model_copy(update={"model": model})
    if cache_ttl:
        spec = spec.model_copy(update={"prompt_cache_ttl": cache_ttl})
    if fallback_model:
        spec = spec.model_copy(update={"fallback_model": fallback_model})
    return spec


def list_(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
          ) -> None:
    """Every session: id, phase, turn, context use, checkpoints, last activity."""
    async def main() -> None:
        sessions = await (await connect(load_settings())).list_sessions()
        if as_json:
            console.print_json(json.dumps([s.model_dump(mode="json") for s in sessions]))
            return
        table = Table("session", "phase", "turn", "context", "checkpoints", "last activity")
        now = datetime.now().astimezone()
        for s, depth in session_tree(sessions):
            table.add_row("  " * depth + ("└ " if depth else "") + escape(s.session_id), s.phase,
                          str(s.turn), f"{s.context_percent:.0f}%", str(s.checkpoints),
                          ago(s.last_activity, now))
        console.print(table)
    run(main())


def session_tree(sessions: list[SessionSummary]) -> list[tuple[SessionSummary, int]]:
    """The sessions in order, each child under its parent (delegation), with its depth."""
    ids = {s.session_id for s in sessions}
    children: dict[str | None, list[SessionSummary]] = {}
    for s in sessions:
        children.setdefault(s.parent if s.parent in ids else None, []).append(s)
    out: list[tuple[SessionSummary, int]] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in children.get(parent, []):
            out.append((s, depth))
            walk(s.session_id, depth + 1)
    walk(None, 0)
    return out


def end(session: str,
        reason: Annotated[str, typer.Option("--reason", help="Why.")] = "ended on request",
        ) -> None:
    """End a session: it finishes its handlers and completes with its final status."""
    async def main() -> None:
        final = await (await session_handle(session)).end(reason)
        console.print(f"ended session [bold]{escape(final.session_id)}[/] after turn {final.turn}")
    run(main())


async def compact_line(handle: SessionHandle) -> str:
    """A checkpoint now (the same chain and checks as an automatic one), as one line
    saying what it did: the context before and after it."""
    before = await handle.status()
    with working("Checkpointing…"):
        after = await handle.checkpoint_now()
    if after.checkpoint_count == before.checkpoint_count:
        why = f": {escape(after.last_error)}" if after.last_error else " (nothing to condense)"
        return (f"no checkpoint taken{why}; context {after.context_tokens:,} / "
                f"{after.context_window:,} tokens")
    return (f"◆ checkpoint {after.checkpoint_count}: context {before.context_tokens:,} "
            f"tokens before → {after.context_tokens:,} after (window "
            f"{after.context_window:,})")


def compact(session: str) -> None:
    """A checkpoint now, through the same chain and checks as an automatic one."""
    async def main() -> None:
        console.print(await compact_line(await session_handle(session)))
    run(main())


def send(
    session: str,
    text: Annotated[str, typer.Argument(
        help="The message (left out: only the files go); - reads it from standard input.")
    ] = "",
    wait: Annotated[bool, typer.Option("--wait", "-w", help="Wait for the reply.")] = False,
    on_busy: Annotated[InterruptPolicy | None, typer.Option(
        "--on-busy", help="While a turn runs: enqueue (wait), interrupt (stop it) or "
        "reject (refuse). Default: the agent's, or enqueue.")] = None,
    attach: AttachOption = None,
    attach_workspace: AttachWorkspaceOption = None,
) -> None:
    """Send the user's message; prints its seq (and, with --wait, the reply as it streams,
    its tool calls and results, checkpoints, and a footer of context use)."""
    async def main(text: str) -> None:
        text = given_text(text)
        handle = await session_handle(session)
        files = [*(await put_attachments(load_settings(), session, attach) if attach else []),
                 *(attach_workspace or [])]
        if not wait or on_busy is not None:
            accepted = await needs_worker(handle, handle.send(text, on_busy=on_busy,
                                                              attachments=files))
            console.print(f"seq {accepted.seq}")
            if wait:
                console.print(escape((await handle.wait_reply(accepted.seq)).reply_text))
            return
        await needs_worker(handle, say(handle, text, LiveView(console, whole_turns=True),
                                       attachments=files))
    run(main(text))


class SignalKind(StrEnum):
    watch = "watch"
    task = "task"
    agent_run = "agent-run"
    callback = "callback"


def signal_(
    session: str,
    kind: SignalKind,
    text: Annotated[str, typer.Argument(help="The input's text; - reads it from standard "
                                             "input.")],
    id: Annotated[str, typer.Option("--id", help="Watch / task / run id.")],
    name: Annotated[str | None, typer.Option("--name", help="Watch or task name.")] = None,
    from_: Annotated[str | None, typer.Option("--from",
                                              help="Sending session (agent-run, callback).")
                     ] = None,
    attach: AttachOption = None,
    attach_workspace: AttachWorkspaceOption = None,
) -> None:
    """Send a background input; Keel writes its source line from the kind, never the text."""
    needs = {SignalKind.watch: ("--name", name), SignalKind.task: ("--name", name),
             SignalKind.agent_run: ("--from", from_), SignalKind.callback: ("--from", from_)}
    flag, value = needs[kind]
    if not value:
        error(f"{kind.value} needs {flag}")
        raise typer.Exit(2)

    async def main(value: str) -> None:
        text_ = given_text(text)
        handle = await session_handle(session)
        files = [*(await put_attachments(load_settings(), session, attach) if attach else []),
                 *(attach_workspace or [])]
        signals: dict[SignalKind, Callable[[], Awaitable[None]]] = {
            SignalKind.watch: lambda: handle.watch(id, value, text_, attachments=files),
            SignalKind.task: lambda: handle.task(id, value, text_, attachments=files),
            SignalKind.agent_run: lambda: handle.agent_run(id, value, text_,
                                                           attachments=files),
            SignalKind.callback: lambda: handle.callback(id, value, text_, attachments=files),
        }
        await signals[kind]()
        console.print(f"signalled {kind.value} {escape(id)} to {escape(session)}")
    run(main(value))


def model_line(status: SessionStatus) -> str:
    """The session's model, and the one that answered when another did: the offline model
    stands in for it on a worker with no API key (spend is still counted at the session's
    model's prices, so budgets can be tried offline)."""
    answered = status.answered_by
    if answered is None or answered.startswith(status.model):  # a dated name of the alias
        return status.model
    if answered == OFFLINE_MODEL_NAME:
        return (f"{status.model}, answered by the {model_label(answered)}: the worker has "
                f"no API key (spend at {status.model}'s prices)")
    return f"{status.model} (answered by {answered})"


def status_table(status: SessionStatus) -> Table:
    pct = 100 * status.context_tokens / max(1, status.context_window)
    return key_values([
        ("session", status.session_id),
        ("phase", status.phase.value),
        ("turn", status.turn),
        ("context", f"{status.context_tokens:,} / {status.context_window:,} tokens "
                    f"({pct:.0f}%), checkpoint at {status.checkpoint_threshold:,}"),
        ("checkpoints", status.checkpoint_count),
        ("pending inputs", status.pending_inputs),
        ("window starts at", f"#{status.window_start_seq}"),
        ("last seq", status.last_seq),
        ("model", model_line(status)),
        *([("stopped", status.stopped_reason)] if status.stopped_reason else []),
        *[("awaiting approval", f"{p.tool} (call {p.call_id}) since "
                                f"{p.since.isoformat(timespec='seconds')}")
          for p in status.pending_approvals],
        *([("last error", status.last_error)] if status.last_error else []),
        ("spent", status.spent.said()),
        ("prompt cache", f"kept {status.prompt_cache_ttl.value} "
                         f"({status.prompt_cache_setting.value})"),
        *([("budget", f"paused: the {status.budget_request.scope.value}'s budget is "
                      f"reached ({'; '.join(status.budget_request.reached)}), request "
                      f"{status.budget_request.request_id}")]
          if status.budget_request else []),
        *([("parent", f"#{status.parent_session}")] if status.parent_session else []),
        *[("wakeup", f"{w.id}: {wakeup_when(w)} ({escape(w.note[:60])})")
          for w in status.wakeups],
        *[("child", f"#{c.session_id} ({c.agent}): {c.done or 'working'}")
          for c in status.children],
    ])


def status(session: str,
           as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
           ) -> None:
    """Phase, turn, context use and checkpoints of a session."""
    async def main() -> None:
        handle = await session_handle(session)
        result = await handle.status()
        closed = await handle.closed_as()
        if closed and closed != "completed":  # cancelled or terminated by other means
            result = result.model_copy(update={"stopped_reason": f"the session was {closed}"})
        if as_json:  # plain stdout: no colour codes, no wrapping, for scripts
            sys.stdout.write(result.model_dump_json() + "\n")
        else:
            console.print(status_table(result))
    run(main())


# The session's texts, one query each: the command's name is the client method's.
QUERIES = {
    "mind": "The session's mind: where it stands, goals, decisions, lessons.",
    "memo": "The user's own words the session keeps, copied from the record.",
    "now": "The session's working state: step, progress, waiting on, next.",
}


async def state_text(handle: SessionHandle, name: str) -> str:
    """One of the session's texts (`QUERIES`) as printed: escaped, or why there is none
    (no checkpoint yet, or the checkpoints kept nothing in it)."""
    text: str = await getattr(handle, name)()
    if text:
        return escape(text)
    taken = (await handle.status()).checkpoint_count
    if taken:
        return f"[dim](the {name} is empty: {taken} checkpoint{'s' * (taken != 1)} kept " \
               "nothing in it)[/]"
    return f"[dim](no {name} yet: it is written by the first checkpoint)[/]"


def query_command(name: str) -> Callable[[str], None]:
    """The command that prints one of the session's texts (`QUERIES`)."""
    def command(session: str) -> None:
        async def main() -> None:
            console.print(await state_text(await session_handle(session), name))
        run(main())
    command.__doc__ = QUERIES[name]
    return command
