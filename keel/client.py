"""A small client for other services: start a session, send, signal, query.

    keel = await KeelClient.connect(KeelSettings.from_env())
    session = await keel.start_session("support-42")
    accepted = await session.send("Review the queue, oldest first.")
    outcome = await session.wait_reply(accepted.seq)
"""

from __future__ import annotations

import uuid

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from schemas.config import KeelSettings
from schemas.session import (
    AgentRunInput,
    AwaitReply,
    CallbackInput,
    MessageAccepted,
    SessionConfig,
    SessionInput,
    SessionStatus,
    TaskInput,
    TurnOutcome,
    UserMessage,
    WatchInput,
)
from workflows.session import SessionWorkflow


class SessionExistsError(Exception):
    """A session with this id exists already; Keel never starts a second one."""


class MessageRejectedError(Exception):
    """The session refused the message (empty, too long, stopped); nothing was recorded."""


class SessionStoppedError(MessageRejectedError):
    """The session has ended (for example grown too long); start a new one."""


def session_config(settings: KeelSettings, **overrides: object) -> SessionConfig:
    model = settings.model
    base = SessionConfig(
        model=model.name, context_window=model.context_window,
        max_output_tokens=model.max_output_tokens, price_step_tokens=model.price_step_tokens,
        max_message_chars=settings.max_message_chars, user_name=settings.user_name)
    return base.model_copy(update=overrides)


class SessionHandle:
    def __init__(self, handle: WorkflowHandle[SessionWorkflow, SessionStatus]) -> None:
        self.handle = handle

    @property
    def session_id(self) -> str:
        return self.handle.id

    async def send(self, text: str, input_id: str | None = None) -> MessageAccepted:
        try:
            return await self.handle.execute_update(
                SessionWorkflow.send_message, UserMessage(text=text, input_id=input_id))
        except WorkflowUpdateFailedError as err:
            raise MessageRejectedError(str(err.cause or err)) from err
        except RPCError as err:
            if "already completed" not in str(err):
                raise
            final = await self.handle.result()
            raise SessionStoppedError(
                f"session {self.session_id} has stopped: {final.stopped_reason or 'ended'}"
            ) from err

    async def wait_reply(self, seq: int) -> TurnOutcome:
        while True:
            outcome = await self.handle.execute_update(SessionWorkflow.await_reply,
                                                       AwaitReply(seq=seq))
            if not outcome.retry:  # a retry means the session continued as new: ask it
                return outcome

    async def ask(self, text: str) -> TurnOutcome:
        accepted = await self.send(text)
        return await self.wait_reply(accepted.seq)

    async def watch(self, watch_id: str, name: str, text: str) -> None:
        await self.handle.signal(SessionWorkflow.watch,
                                 WatchInput(watch_id=watch_id, name=name, text=text))

    async def task(self, task_id: str, name: str, text: str) -> None:
        await self.handle.signal(SessionWorkflow.task,
                                 TaskInput(task_id=task_id, name=name, text=text))

    async def agent_run(self, run_id: str, from_session: str, text: str) -> None:
        await self.handle.signal(SessionWorkflow.agent_run, AgentRunInput(
            run_id=run_id, from_session=from_session, text=text))

    async def callback(self, run_id: str, from_session: str, text: str) -> None:
        await self.handle.signal(SessionWorkflow.callback, CallbackInput(
            run_id=run_id, from_session=from_session, text=text))

    async def status(self) -> SessionStatus:
        return await self.handle.query(SessionWorkflow.status)

    async def mind(self) -> str:
        return await self.handle.query(SessionWorkflow.mind)

    async def memo(self) -> str:
        return await self.handle.query(SessionWorkflow.memo)

    async def now(self) -> str:
        return await self.handle.query(SessionWorkflow.now)


class KeelClient:
    def __init__(self, client: Client, task_queue: str, settings: KeelSettings) -> None:
        self.client = client
        self.task_queue = task_queue
        self.settings = settings

    @classmethod
    async def connect(cls, settings: KeelSettings, address: str | None = None) -> KeelClient:
        target = address or settings.temporal_address
        if not target:
            from keel.devstack import read_stack_file

            stack = read_stack_file(settings.data_dir)
            if not stack:
                raise RuntimeError(
                    "no Temporal to talk to: set TEMPORAL_ADDRESS, or run `keel dev` first")
            target = stack["temporal_address"]
        client = await Client.connect(target, namespace=settings.temporal_namespace,
                                      data_converter=pydantic_data_converter)
        return cls(client, settings.task_queue, settings)

    def session(self, session_id: str) -> SessionHandle:
        return SessionHandle(self.client.get_workflow_handle_for(
            SessionWorkflow.run, session_id))  # type: ignore[arg-type]

    async def start_session(self, session_id: str | None = None,
                            config: SessionConfig | None = None) -> SessionHandle:
        session_id = session_id or f"session-{uuid.uuid4().hex[:12]}"
        try:
            handle = await self.client.start_workflow(
                SessionWorkflow.run,
                SessionInput(session_id=session_id,
                             config=config or session_config(self.settings)),
                id=session_id, task_queue=self.task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
            )
        except (WorkflowAlreadyStartedError, RPCError) as err:
            if isinstance(err, RPCError) and "already" not in str(err).lower():
                raise
            raise SessionExistsError(f"session {session_id!r} exists already") from err
        return SessionHandle(handle)

    async def start_with_message(self, session_id: str, text: str,
                                 config: SessionConfig | None = None,
                                 ) -> tuple[SessionHandle, MessageAccepted]:
        """Update-with-start: the first message acknowledged in the same call; reuses a
        running session of that id rather than starting a second."""
        start = WithStartWorkflowOperation(
            SessionWorkflow.run,
            SessionInput(session_id=session_id, config=config or session_config(self.settings)),
            id=session_id, task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        try:
            accepted = await self.client.execute_update_with_start_workflow(
                SessionWorkflow.send_message, UserMessage(text=text),
                start_workflow_operation=start)
        except WorkflowUpdateFailedError as err:
            raise MessageRejectedError(str(err.cause or err)) from err
        return SessionHandle(await start.workflow_handle()), accepted
