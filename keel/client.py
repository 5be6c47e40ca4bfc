"""A small typed client for other services; it needs only temporalio and pydantic.

It calls the session workflow by name (`schemas.session.SESSION_WORKFLOW`, `Handler`), so
importing it loads no workflow, activity, database or model code; and every refusal
arrives as one of the exceptions below, mapped by type in `keel._errors`.

    keel = await KeelClient.connect(KeelSettings.from_env(), address="localhost:7233")
    session = await keel.start_session("support-42")
    outcome = await session.ask("Review the queue, oldest first.")  # one update
    print(outcome.reply_text)
    accepted = await session.send("And then?")  # or in two steps: the seq first
    outcome = await session.wait_reply(accepted.seq)
    async for offset, event in session.events(after=0):   # the live view, typed events
        ...
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict, Unpack

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecution,
    WorkflowHandle,
    WorkflowHistory,
    WorkflowQueryFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from keel import branching, deletion
from keel._approvals import SessionApprovals
from keel._control import SessionControls
from keel._errors import (
    AgentSpecRefusedError,
    BranchRefusedError,
    DeleteRefusedError,
    FileRefusedError,
    KeelError,
    MessageRejectedError,
    NoBudgetRequestError,
    NoSuchInputError,
    NoTemporalAddressError,
    NotPendingError,
    RecordFailedError,
    SessionBusyError,
    SessionExistsError,
    SessionNotFoundError,
    SessionStoppedError,
    StartRefusedError,
    already_started,
    raise_if_cancelled,
    refusals,
    start_with_message_refused,
)
from keel._files import SessionFiles
from keel._queues import POLLER_FRESH_S, polled_recently
from keel.deletion import SessionDeleted
from keel.events import EventsMissed, Transport, session_events, stream_offset
from schemas.agent import (
    BUILTIN_TOOL_NAMES,
    AgentSpec,
    AgentSpecError,
    check_spec,
)
from schemas.branch import ForkDone, ImportDone, RewindDone, RewindRequest
from schemas.cache_ttl import CacheTtl
from schemas.config import KeelSettings
from schemas.events import SessionEvent
from schemas.interrupt import InterruptPolicy
from schemas.session import (
    MAX_INPUT_ID_CHARS,
    MAX_NOTE_CHARS,
    SESSION_WORKFLOW,
    AgentRunInput,
    AwaitReply,
    CallbackInput,
    EndSession,
    Handler,
    MessageAccepted,
    ReadReply,
    Rejection,
    ReplyPart,
    SessionConfig,
    SessionInput,
    SessionState,
    SessionStatus,
    SessionSummary,
    TaskInput,
    TurnOutcome,
    UserMessage,
    WatchInput,
    config_bounds_problem,
    id_clause,
    session_id_problem,
    text_limits,
)
from schemas.text import payload_problem, storable_problem
from workers.connect import connect

TEXTS_WAIT_S = 30  # a mind / memo / now query while a new run reads them back

__all__ = [
    "AgentSpecRefusedError",
    "BranchRefusedError",
    "DeleteRefusedError",
    "EventsMissed",
    "FileRefusedError",
    "KeelClient",
    "KeelError",
    "MessageRejectedError",
    "NoBudgetRequestError",
    "NoSuchInputError",
    "NoTemporalAddressError",
    "NotPendingError",
    "RecordFailedError",
    "SessionBusyError",
    "SessionDeleted",
    "SessionExistsError",
    "SessionHandle",
    "SessionNotFoundError",
    "SessionOverrides",
    "SessionStoppedError",
    "StartRefusedError",
    "Transport",
    "session_config",
]


class SessionOverrides(TypedDict, total=False):
    """What a caller may set on a session's `SessionConfig`, by name and type."""

    model: str
    context_window: int
    max_output_tokens: int
    price_step_tokens: int | None
    max_message_chars: int
    user_name: str
    max_tool_rounds_per_turn: int
    record_timeout_s: int
    continue_as_new_after_events: int
    memory_scope: str | None  # whose long memory (schemas.vault.scope); None: none
    prompt_cache_ttl: CacheTtl  # auto (the default), 5m or 1h (schemas.cache_ttl)
    agent: AgentSpec | None  # prefer `start_session(agent=...)`: it checks the spec


def session_config(settings: KeelSettings, **overrides: Unpack[SessionOverrides]
                   ) -> SessionConfig:
    """The session's config from the settings' model and limits, with `overrides` on top."""
    unknown = set(overrides) - SessionOverrides.__optional_keys__
    if unknown:
        raise TypeError(f"session_config got unknown overrides: {', '.join(sorted(unknown))}")
    model = settings.model
    return SessionConfig.model_validate({
        "model": model.name, "context_window": model.context_window,
        "max_output_tokens": model.max_output_tokens,
        "price_step_tokens": model.price_step_tokens,
        "max_message_chars": settings.max_message_chars, "user_name": settings.user_name,
        **overrides,
    })


class SessionHandle(SessionControls, SessionApprovals, SessionFiles):
    """One session: send it the user's messages and background inputs, read its state."""

    def __init__(self, handle: WorkflowHandle[Any, SessionStatus], client: Client,
                 settings: KeelSettings | None = None) -> None:
        self.handle = handle
        self.client = client
        # The store's per-file limit, checked before a put is sent (the worker's own
        # settings are the ones that hold; these should match them).
        self.max_file_bytes = (settings or KeelSettings()).max_file_bytes
        # The provider profiles a new agent may name (None: not checked here).
        self.provider_names = settings.provider_names() if settings else None

    @property
    def session_id(self) -> str:
        return self.handle.id

    async def send(self, text: str, input_id: str | None = None,
                   on_busy: InterruptPolicy | None = None) -> MessageAccepted:
        """Record the user's message; raises `MessageRejectedError` (or a subclass) when
        the session refused it, in which case nothing was recorded. `on_busy`: what it
        does while a turn runs (schemas.interrupt; None: the spec's, or enqueue)."""
        refuse_before_sending(text, input_id=input_id)
        async with refusals(self.handle):
            accepted: MessageAccepted = await self.handle.execute_update(
                Handler.SEND_MESSAGE, UserMessage(text=text, input_id=input_id,
                                                  on_busy=on_busy),
                result_type=MessageAccepted)
        return accepted

    async def wait_reply(self, seq: int) -> TurnOutcome:
        """Wait for the turn that answers input `seq`, across continue-as-new, and however
        long the turn takes (one update call is cut off by the server after about a
        minute; the wait is asked again, the update is read-only)."""
        while True:
            try:
                async with refusals(self.handle):
                    outcome: TurnOutcome = await self.handle.execute_update(
                        Handler.AWAIT_REPLY, AwaitReply(seq=seq), result_type=TurnOutcome)
            except WorkflowUpdateRPCTimeoutOrCancelledError as err:
                raise_if_cancelled(err)
                continue
            if not outcome.retry:  # a retry means the session continued as new: ask it
                return await self._whole(outcome)

    async def ask(self, text: str, input_id: str | None = None,
                  on_busy: InterruptPolicy | None = None) -> TurnOutcome:
        """A plain turn in one update (`Handler.ASK`): record the message and wait for the
        turn that answers it. The refusals of `send` apply (nothing recorded then). When the
        server cuts the call off, the same update (its id names the input) is asked again,
        which Temporal answers once; when the session continues as new meanwhile, the wait
        goes on with `wait_reply` for the input's seq."""
        refuse_before_sending(text, input_id=input_id)
        input_id = input_id or f"ask-{uuid.uuid4().hex}"
        while True:
            try:
                async with refusals(self.handle):
                    outcome: TurnOutcome = await self.handle.execute_update(
                        Handler.ASK, UserMessage(text=text, input_id=input_id,
                                                 on_busy=on_busy),
                        id=f"ask:{input_id}", result_type=TurnOutcome)
            except WorkflowUpdateRPCTimeoutOrCancelledError as err:
                raise_if_cancelled(err)
                continue
            if not outcome.retry or not outcome.input_seqs:
                return await self._whole(outcome)
            return await self.wait_reply(outcome.input_seqs[0])

    async def _whole(self, outcome: TurnOutcome) -> TurnOutcome:
        """The outcome with its reply's whole text: a long reply travels through the
        session as its start (`reply_cut`), and the rest is read from the record."""
        if not outcome.reply_cut or outcome.reply_seq is None:
            return outcome
        text = outcome.reply_text
        while len(text) < outcome.reply_chars:
            async with refusals(self.handle):
                part: ReplyPart = await self.handle.execute_update(
                    Handler.READ_REPLY, ReadReply(seq=outcome.reply_seq, start=len(text)),
                    result_type=ReplyPart)
            if not part.text:
                break
            text += part.text
        return outcome.model_copy(update={"reply_text": text, "reply_cut": False})

    async def _signal(self, handler: Handler, arg: WatchInput | TaskInput | AgentRunInput
                      | CallbackInput) -> None:
        """A background input; what the session would only record as a notice (over the
        payload limit, an id or name over its bound) is refused here, before sending."""
        ids = {k: v for k, v in arg.model_dump().items() if k != "text" and v is not None}
        refuse_before_sending(arg.text, **ids)
        async with refusals(self.handle):
            await self.handle.signal(handler, arg)

    async def watch(self, watch_id: str, name: str, text: str) -> None:
        await self._signal(Handler.WATCH, WatchInput(watch_id=watch_id, name=name, text=text))

    async def task(self, task_id: str, name: str, text: str) -> None:
        await self._signal(Handler.TASK, TaskInput(task_id=task_id, name=name, text=text))

    async def agent_run(self, run_id: str, from_session: str, text: str) -> None:
        await self._signal(Handler.AGENT_RUN, AgentRunInput(
            run_id=run_id, from_session=from_session, text=text))

    async def callback(self, run_id: str, from_session: str, text: str) -> None:
        await self._signal(Handler.CALLBACK, CallbackInput(
            run_id=run_id, from_session=from_session, text=text))

    async def status(self) -> SessionStatus:
        async with refusals(self.handle):
            status: SessionStatus = await self.handle.query(Handler.STATUS,
                                                            result_type=SessionStatus)
        return status

    async def _text(self, handler: Handler) -> str:
        """A mind / memo / now text; asked again while a run that just continued as new
        reads it back (Rejection.TEXTS_LOADING), for up to TEXTS_WAIT_S."""
        deadline = time.monotonic() + TEXTS_WAIT_S
        while True:
            try:
                async with refusals(self.handle):
                    text: str = await self.handle.query(handler, result_type=str)
                return text
            except WorkflowQueryFailedError as err:
                if Rejection.TEXTS_LOADING.value not in str(err) or \
                        time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def mind(self) -> str:
        return await self._text(Handler.MIND)

    async def memo(self) -> str:
        return await self._text(Handler.MEMO)

    async def now(self) -> str:
        return await self._text(Handler.NOW)

    async def event_offset(self) -> int:
        """The offset the session's next event will have (`events(after=...)` from it
        shows only what happens from now on)."""
        async with refusals(self.handle):
            return await stream_offset(self.client, self.session_id)

    def events(self, after: int = 0, *, transport: Transport = Transport.UPDATE,
               stop_at_end: bool = True,
               ) -> AsyncIterator[tuple[int, SessionEvent | EventsMissed]]:
        """The session's events from offset `after` on, as `(offset, event)`, following it
        across continue-as-new (see `keel.events.session_events`). Resume with the last
        offset seen + 1.

        The default transport spends one of the run's in-flight Updates per waiting reader
        (the server allows 10, shared with `send` and `wait_reply`): keep to one or two
        readers per session, and use `Transport.QUERY` for any more."""
        return session_events(self.client, self.session_id, after,
                              transport=transport, stop_at_end=stop_at_end)


    # ----- the agent, approvals, the session's end ---------------------------------------

    async def is_running(self) -> bool:
        """Whether a session of this id runs now (False: unknown or ended)."""
        from temporalio.client import WorkflowExecutionStatus

        try:
            described = await self.handle.describe()
        except RPCError:
            return False
        return described.status == WorkflowExecutionStatus.RUNNING

    async def queue_without_worker(self, fresh_s: float = POLLER_FRESH_S) -> str | None:
        """The session's task queue when no worker has polled it in the last `fresh_s`
        seconds (keel._queues), else None; None too when the session cannot be described
        (the call that needs the worker will say what is wrong)."""
        try:
            queue = (await self.handle.describe()).task_queue
        except RPCError:
            return None
        return None if await polled_recently(self.client, queue, fresh_s=fresh_s) else queue

    async def closed_as(self) -> str | None:
        """None while running; else Temporal's word for how it closed (completed,
        canceled, terminated, timed out, failed)."""
        from temporalio.client import WorkflowExecutionStatus

        described = await self.handle.describe()
        if described.status in (None, WorkflowExecutionStatus.RUNNING):
            return None
        return described.status.name.lower().replace("_", " ")

    async def agent(self) -> AgentSpec | None:
        async with refusals(self.handle):
            # temporalio types result_type as `type`; its pydantic converter decodes a union.
            spec: AgentSpec | None = await self.handle.query(
                Handler.AGENT, result_type=AgentSpec | None)  # type: ignore[arg-type]
        return spec

    async def set_agent(self, spec: AgentSpec) -> SessionStatus:
        """A new agent for later turns (recorded as a notice); `AgentSpecRefusedError`,
        and nothing changed, for a spec Keel refuses (as at start)."""
        try:  # the provider profiles are the settings' (the workflow cannot know them)
            check_spec(spec, BUILTIN_TOOL_NAMES, self.provider_names)
        except AgentSpecError as err:
            raise AgentSpecRefusedError(str(err)) from None
        async with refusals(self.handle):
            status: SessionStatus = await self.handle.execute_update(
                Handler.SET_AGENT, spec, result_type=SessionStatus)
        return status

    async def refresh_mcp(self) -> list[str]:
        async with refusals(self.handle):
            names: list[str] = await self.handle.execute_update(Handler.REFRESH_MCP,
                                                                result_type=list[str])
        return names

    async def end(self, reason: str = "ended on request") -> SessionStatus:
        """End the session: it finishes its handlers and completes with its final status."""
        problem = text_limits(reason=(reason, MAX_NOTE_CHARS))
        if problem:
            raise MessageRejectedError(f"the end request's {problem}")
        async with refusals(self.handle):
            status: SessionStatus = await self.handle.execute_update(
                Handler.END, EndSession(reason=reason), result_type=SessionStatus)
        return status

    async def checkpoint_now(self) -> SessionStatus:
        """A checkpoint through the same chain and checks as an automatic one."""
        async with refusals(self.handle):
            status: SessionStatus = await self.handle.execute_update(
                Handler.CHECKPOINT_NOW, result_type=SessionStatus)
        return status

    async def state(self) -> SessionState:
        """The session's small state (keel.branching: what a fork or an export reads)."""
        return await branching.session_state(self)

    async def rewind(self, to_seq: int) -> RewindDone:
        """Go on from `to_seq`: the rows after it are marked rewound, the context and the
        workspace are as they were there. Only while idle (`BranchRefusedError`)."""
        async with refusals(self.handle):
            done: RewindDone = await self.handle.execute_update(
                Handler.REWIND, RewindRequest(to_seq=to_seq), result_type=RewindDone)
        return done


def refuse_before_sending(text: str, **ids: str | None) -> None:
    """What Temporal could not carry (over the payload limit) or the converter could not
    encode (a surrogate) is refused here, with the session's own wording, before any call;
    so is an id (`input_id`, `watch_id`, ...) over `MAX_INPUT_ID_CHARS`. The session applies
    the same rules (`schemas.text`, `schemas.session`) to other clients."""
    problem = payload_problem(text) or (
        storable_problem(text) if any("\ud800" <= c <= "\udfff" for c in text) else None)
    long = text_limits(**{name.replace("_", " "): (value, MAX_INPUT_ID_CHARS)
                          for name, value in ids.items() if value is not None})
    problem = problem or (f"the {long}" if long else None)
    if problem:
        raise MessageRejectedError(problem)


class KeelClient:
    """Sessions on one Temporal namespace and task queue."""

    def __init__(self, client: Client, task_queue: str, settings: KeelSettings) -> None:
        self.client = client
        self.task_queue = task_queue
        self.settings = settings

    @classmethod
    async def connect(cls, settings: KeelSettings, address: str | None = None) -> KeelClient:
        """Connect to `address`, else `settings.temporal_address`, with the settings' TLS
        and API key (`workers.connect`); finding a local dev stack is the caller's job (the
        CLI reads `keel dev`'s stack file)."""
        target = address or settings.temporal_address
        if not target:
            raise NoTemporalAddressError(
                "no Temporal address: pass one, or set TEMPORAL_ADDRESS")
        return cls(await connect(settings, target), settings.task_queue, settings)

    def _handle(self, session_id: str) -> WorkflowHandle[Any, SessionStatus]:
        return self.client.get_workflow_handle(session_id, result_type=SessionStatus)

    def session(self, session_id: str) -> SessionHandle:
        """A handle on an existing session; no call is made until it is used."""
        return SessionHandle(self._handle(session_id), self.client, self.settings)

    def _input(self, session_id: str, config: SessionConfig | None,
               agent: AgentSpec | None = None) -> SessionInput:
        if bad_id := session_id_problem(session_id):  # the session would refuse it
            raise StartRefusedError(bad_id)
        config = config or session_config(self.settings)
        if agent is not None:
            try:  # refused here, before anything is started
                check_spec(agent, BUILTIN_TOOL_NAMES, self.settings.provider_names())
            except AgentSpecError as err:
                raise AgentSpecRefusedError(str(err)) from None
            config = config.with_agent(agent)
        # Refused here too, before anything starts (the session would refuse it: its window
        # leaves its agent, or Keel's own prompt, no room). Imported here: counting may load
        # the tokenizer, which a light client need not import.
        from schemas.input_size import config_fit_problem

        too_big = config_fit_problem(config)
        if too_big and config.agent is not None:
            raise AgentSpecRefusedError(str(AgentSpecError([too_big])))
        if problem := config_bounds_problem(config) or too_big:
            raise StartRefusedError(f"the session's config is refused: {problem}")
        return SessionInput(session_id=session_id, config=config)

    async def list_sessions(self, query: str | None = None) -> list[SessionSummary]:
        """Every session (newest first) with its phase, turn, context use, checkpoints and
        last activity, from Temporal visibility: the memo each session keeps up to date."""
        out: list[SessionSummary] = []
        q = f'WorkflowType = "{SESSION_WORKFLOW}"' + (f" AND ({query})" if query else "")
        seen: set[str] = set()
        async for wf in self.client.list_workflows(q):
            if wf.id in seen:  # continue-as-new: the newest run only
                continue
            seen.add(wf.id)
            memo = (await wf.memo()).get("keel") or {}
            status = wf.status.name.lower() if wf.status else ""
            phase = str(memo.get("phase", "")) if status in ("running", "completed",
                                                             "continued_as_new") else status
            out.append(SessionSummary(
                session_id=wf.id, phase=phase or status, turn=int(memo.get("turn", 0)),
                context_percent=float(memo.get("context_percent", 0.0)),
                checkpoints=int(memo.get("checkpoints", 0)), parent=memo.get("parent"),
                last_activity=str(memo.get("last_activity") or
                                  (wf.close_time or wf.start_time).isoformat(
                                      timespec="seconds")),
                status=status))
        return out

    async def start_session(self, session_id: str | None = None,
                            config: SessionConfig | None = None,
                            agent: AgentSpec | None = None) -> SessionHandle:
        """Start a new session; `SessionExistsError` if the id was ever used,
        `AgentSpecRefusedError` (nothing started) if `agent` is refused."""
        session_id = session_id or f"session-{uuid.uuid4().hex[:12]}"
        try:
            handle: WorkflowHandle[Any, SessionStatus] = await self.client.start_workflow(
                SESSION_WORKFLOW, self._input(session_id, config, agent),
                id=session_id, task_queue=self.task_queue, result_type=SessionStatus,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            )
        except WorkflowAlreadyStartedError as err:
            raise already_started(session_id) from err
        return SessionHandle(handle, self.client, self.settings)

    async def start_with_message(self, session_id: str, text: str,
                                 config: SessionConfig | None = None,
                                 agent: AgentSpec | None = None,
                                 ) -> tuple[SessionHandle, MessageAccepted]:
        """Update-with-start: the first message acknowledged in the same call. Reuses a
        running session of that id rather than starting a second, and never starts a new
        run under the id of one that has ended (`SessionStoppedError`)."""
        start: WithStartWorkflowOperation[Any, SessionStatus] = WithStartWorkflowOperation(
            SESSION_WORKFLOW, self._input(session_id, config, agent),
            id=session_id, task_queue=self.task_queue, result_type=SessionStatus,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        )
        refuse_before_sending(text)
        handle = self._handle(session_id)
        try:
            async with refusals(handle):
                accepted: MessageAccepted = await self.client.execute_update_with_start_workflow(
                    Handler.SEND_MESSAGE, UserMessage(text=text),
                    start_workflow_operation=start, result_type=MessageAccepted)
        except WorkflowAlreadyStartedError as err:
            with suppress(WorkflowAlreadyStartedError):
                await start.workflow_handle()  # the same error, retrieved: no warning
            raise await start_with_message_refused(handle) from err
        return (SessionHandle(await start.workflow_handle(), self.client, self.settings),
                accepted)

    async def fork(self, session_id: str, *, at_seq: int | None = None,
                   checkpoint: int | None = None, new_id: str | None = None,
                   request_id: str | None = None) -> ForkDone:
        """A new session from `session_id` at a point (keel.branching.fork_session)."""
        return await branching.fork_session(self, session_id, at_seq=at_seq,
                                            checkpoint=checkpoint, new_id=new_id,
                                            request_id=request_id)

    async def export_session(self, session_id: str, path: Path | None = None, *,
                             with_memory: bool = False) -> bytes:
        """The session's bundle (schemas.branch), also written to `path` if given;
        `with_memory`: with its cards and daily-note entries (keel.branching)."""
        return await branching.export_session(self, session_id, path,
                                              with_memory=with_memory)

    async def import_session(self, bundle: bytes, new_id: str | None = None,
                             request_id: str | None = None, *, trust: bool = False,
                             agent: AgentSpec | None = None, with_memory: bool = True,
                             memory_scope: str | None = None) -> ImportDone:
        """A bundle's session started here, under `new_id` or its own id (the options:
        keel.branching.import_session)."""
        return await branching.import_session(
            self, bundle, new_id, request_id=request_id, trust=trust, agent=agent,
            with_memory=with_memory, memory_scope=memory_scope)

    async def delete_session(self, session_id: str, *, force: bool = False,
                             database_url: str | None = None,
                             memory_scope: str | None = None,
                             sub_agents: bool = False) -> SessionDeleted:
        """Delete a session and all it owns: its record, workspace, wakeups, workflow
        histories and daily-note entries (keel.deletion). A running one only with `force`,
        which stops it first; its sub-agents' sessions only with `sub_agents`; the scope's
        cards stay (the result names what stayed)."""
        return await deletion.delete_session(self, session_id, force=force,
                                             database_url=database_url,
                                             memory_scope=memory_scope, sub_agents=sub_agents)

    async def sessions_ended_before(self, when: datetime) -> list[str]:
        """The sessions whose newest run closed before `when`, oldest first (what a
        retention policy deletes: keel.deletion.ended_before)."""
        return await deletion.ended_before(self, when)

    async def runs(self, session_id: str) -> list[WorkflowExecution]:
        """Every run of the workflow `session_id` Temporal's visibility lists, oldest first
        (exactly that id: `id_clause` may list more)."""
        found = [e async for e in self.client.list_workflows(
            id_clause("WorkflowId", session_id)) if e.id == session_id]
        return sorted(found, key=lambda e: e.start_time)

    async def histories(self, session_id: str, run_id: str | None = None
                        ) -> list[WorkflowHistory]:
        """The history of every run of a session, oldest first (a session continues as new
        to keep each one bounded), or of `run_id` only; empty for an unknown session."""
        runs = [run_id] if run_id else [e.run_id for e in await self.runs(session_id)]
        return [await self.client.get_workflow_handle(session_id, run_id=r).fetch_history()
                for r in runs]
