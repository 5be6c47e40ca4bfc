"""One session's face for other services: `KeelClient.session(id)` (keel.client) gives it.

It sends the user's messages and background inputs, and reads the session's state, texts and
events; what the session would refuse for its size or characters is refused here first, in
the session's own words (`refuse_before_sending`), so nothing is sent that could not be
recorded. Like keel.client it needs only temporalio and pydantic: the workflow is called by
name (`schemas.session.Handler`), and every refusal arrives as a `keel._errors` exception.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from temporalio.client import (
    Client,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError

from keel import branching
from keel._approvals import SessionApprovals
from keel._control import SessionControls
from keel._errors import (
    AgentSpecRefusedError,
    MessageRejectedError,
    raise_if_cancelled,
    refusals,
)
from keel._files import Attachments, SessionFiles
from keel._queues import POLLER_FRESH_S, polled_recently
from keel.events import EventsMissed, Transport, session_events, stream_offset
from schemas.agent import (
    BUILTIN_TOOL_NAMES,
    AgentSpec,
    AgentSpecError,
    check_spec,
)
from schemas.branch import RewindDone, RewindRequest
from schemas.config import KeelSettings
from schemas.events import SessionEvent
from schemas.interrupt import InterruptPolicy
from schemas.session import (
    MAX_INPUT_ID_CHARS,
    MAX_NOTE_CHARS,
    AgentRunInput,
    AwaitReply,
    CallbackInput,
    EndSession,
    Handler,
    MessageAccepted,
    ReadReply,
    Rejection,
    ReplyPart,
    SessionState,
    SessionStatus,
    TaskInput,
    TurnOutcome,
    UserMessage,
    WatchInput,
    text_limits,
)
from schemas.text import payload_problem, storable_problem

TEXTS_WAIT_S = 30  # a mind / memo / now query while a new run reads them back

__all__ = ["SessionHandle", "refuse_before_sending"]


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
                   on_busy: InterruptPolicy | None = None, *,
                   attachments: Attachments = ()) -> MessageAccepted:
        """Record the user's message; raises `MessageRejectedError` (or a subclass) when
        the session refused it, in which case nothing was recorded. `on_busy`: what it
        does while a turn runs (schemas.interrupt; None: the spec's, or enqueue).
        `attachments`: files sent with the words, images, PDFs or text (schemas.attachments):
        a workspace path, or a (name, bytes) pair put in the workspace first."""
        message = await self._message(text, input_id, on_busy, attachments)
        async with refusals(self.handle):
            accepted: MessageAccepted = await self.handle.execute_update(
                Handler.SEND_MESSAGE, message, result_type=MessageAccepted)
        return accepted

    async def _message(self, text: str, input_id: str | None, on_busy: InterruptPolicy | None,
                       attachments: Attachments) -> UserMessage:
        """The message as sent, once what the session would refuse of it was refused here
        and its files given by their bytes are in the workspace."""
        refuse_before_sending(text, input_id=input_id)
        paths = await self.attachment_paths(attachments) if attachments else []
        return UserMessage(text=text, input_id=input_id, on_busy=on_busy, attachments=paths)

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
                  on_busy: InterruptPolicy | None = None, *,
                  attachments: Attachments = ()) -> TurnOutcome:
        """A plain turn in one update (`Handler.ASK`): record the message and wait for the
        turn that answers it. The refusals of `send` apply (nothing recorded then). When the
        server cuts the call off, the same update (its id names the input) is asked again,
        which Temporal answers once; when the session continues as new meanwhile, the wait
        goes on with `wait_reply` for the input's seq."""
        input_id = input_id or f"ask-{uuid.uuid4().hex}"
        message = await self._message(text, input_id, on_busy, attachments)
        while True:
            try:
                async with refusals(self.handle):
                    outcome: TurnOutcome = await self.handle.execute_update(
                        Handler.ASK, message, id=f"ask:{input_id}", result_type=TurnOutcome)
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
        ids = {k: v for k, v in arg.model_dump().items()
               if k not in ("text", "attachments") and v is not None}
        refuse_before_sending(arg.text, **ids)
        async with refusals(self.handle):
            await self.handle.signal(handler, arg)

    async def _signal_files(self, text: str, attachments: Attachments) -> list[str]:
        """A background input's `attachments`: files sent with it, as `send` takes them (a
        workspace path, or a (name, bytes) pair put in the workspace first); what the
        session would refuse of them, or of its words, is refused before anything is put
        or sent."""
        if not attachments:
            return []
        refuse_before_sending(text)
        return await self.attachment_paths(attachments)

    async def watch(self, watch_id: str, name: str, text: str, *,
                    attachments: Attachments = ()) -> None:
        await self._signal(Handler.WATCH, WatchInput(
            watch_id=watch_id, name=name, text=text,
            attachments=await self._signal_files(text, attachments)))

    async def task(self, task_id: str, name: str, text: str, *,
                   attachments: Attachments = ()) -> None:
        await self._signal(Handler.TASK, TaskInput(
            task_id=task_id, name=name, text=text,
            attachments=await self._signal_files(text, attachments)))

    async def agent_run(self, run_id: str, from_session: str, text: str, *,
                        attachments: Attachments = ()) -> None:
        await self._signal(Handler.AGENT_RUN, AgentRunInput(
            run_id=run_id, from_session=from_session, text=text,
            attachments=await self._signal_files(text, attachments)))

    async def callback(self, run_id: str, from_session: str, text: str, *,
                       attachments: Attachments = ()) -> None:
        await self._signal(Handler.CALLBACK, CallbackInput(
            run_id=run_id, from_session=from_session, text=text,
            attachments=await self._signal_files(text, attachments)))

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
