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

import uuid
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
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from keel import branching, card_forget, deletion, scope_erase
from keel._errors import (
    AgentSpecRefusedError,
    AttachmentRefusedError,
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
    refusals,
    start_with_message_refused,
)
from keel._files import Attachments, checked_attachments
from keel.deletion import SessionDeleted
from keel.events import EventsMissed, Transport
from keel.handle import SessionHandle, refuse_before_sending
from schemas.agent import (
    BUILTIN_TOOL_NAMES,
    AgentSpec,
    AgentSpecError,
    check_spec,
)
from schemas.branch import ForkDone, ImportDone
from schemas.cache_ttl import CacheTtl
from schemas.config import KeelSettings
from schemas.session import (
    SESSION_WORKFLOW,
    Handler,
    MessageAccepted,
    SessionConfig,
    SessionInput,
    SessionStatus,
    SessionSummary,
    UserMessage,
    config_bounds_problem,
    id_clause,
    session_id_problem,
)
from schemas.vault.erase import ScopeErased
from schemas.vault.forget import CardForgotten
from workers.connect import connect

__all__ = [
    "AgentSpecRefusedError",
    "AttachmentRefusedError",
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

    def start_input(self, session_id: str, config: SessionConfig | None,
                    agent: AgentSpec | None = None) -> SessionInput:
        """What a start of `session_id` with `config` (else the settings') and `agent`
        sends, checked here as the session would check it: `StartRefusedError` or
        `AgentSpecRefusedError`, and nothing started, otherwise (an import checks its
        bundle's session so, keel.branching)."""
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
                SESSION_WORKFLOW, self.start_input(session_id, config, agent),
                id=session_id, task_queue=self.task_queue, result_type=SessionStatus,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            )
        except WorkflowAlreadyStartedError as err:
            raise already_started(session_id) from err
        return SessionHandle(handle, self.client, self.settings)

    async def start_or_join(self, session_id: str, config: SessionConfig | None = None,
                            agent: AgentSpec | None = None) -> SessionHandle:
        """The running session of `session_id`, or a new one started under that id; never a
        new run under the id of one that has ended (`SessionStoppedError`)."""
        try:
            handle: WorkflowHandle[Any, SessionStatus] = await self.client.start_workflow(
                SESSION_WORKFLOW, self.start_input(session_id, config, agent),
                id=session_id, task_queue=self.task_queue, result_type=SessionStatus,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
        except WorkflowAlreadyStartedError as err:
            raise await start_with_message_refused(self._handle(session_id)) from err
        return SessionHandle(handle, self.client, self.settings)

    async def start_with_message(self, session_id: str, text: str,
                                 config: SessionConfig | None = None,
                                 agent: AgentSpec | None = None, *,
                                 attachments: Attachments = (),
                                 ) -> tuple[SessionHandle, MessageAccepted]:
        """Update-with-start: the first message acknowledged in the same call. Reuses a
        running session of that id rather than starting a second, and never starts a new
        run under the id of one that has ended (`SessionStoppedError`). `attachments`: files
        sent with the message, as `SessionHandle.send` takes them; what the session would
        refuse of them is refused before anything starts, then the session is started (or
        joined, `start_or_join`), its files put and the message sent: three calls."""
        if attachments:
            refuse_before_sending(text)
            checked_attachments(attachments)
            session = await self.start_or_join(session_id, config, agent)
            return session, await session.send(text, attachments=attachments)
        start: WithStartWorkflowOperation[Any, SessionStatus] = WithStartWorkflowOperation(
            SESSION_WORKFLOW, self.start_input(session_id, config, agent),
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

    async def erase_memory_scope(self, scope: str, *, with_sessions: bool = False,
                                 force: bool = False,
                                 database_url: str | None = None) -> ScopeErased:
        """Erase a memory scope's long memory whole: its vault folder with its git history
        and every row of its index and queues (keel.scope_erase). Refused while a session
        of the scope runs, unless `with_sessions` (every session of the scope deleted
        first) and `force` (running ones stopped)."""
        return await scope_erase.erase_memory_scope(
            self, scope, with_sessions=with_sessions, force=force, database_url=database_url)

    async def forget_card(self, scope: str, card: str) -> CardForgotten:
        """Forget one card of a memory scope, by its title or vault path: its file and
        index rows go, and the nightly rollup does not write it again from material of
        that day or before (keel.card_forget; what still names it is said)."""
        return await card_forget.forget_card(self, scope, card)

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
