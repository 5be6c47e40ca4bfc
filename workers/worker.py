"""Build and run Keel's workers: the session queue and the vault's own queue.

Every workflow and activity a worker runs is listed here by name, so a reader sees all of
them in one place and nothing is registered by scanning a class.

Invariants:
- The session queue (`settings.task_queue`) runs the session workflow and the activities
  that touch only PostgreSQL, the model and the workspace store: any number of workers on
  any hosts serve it. A turn's recall (a read of the memory index in PostgreSQL) runs here
  inside its model call (activities.session).
- The vault queue (`settings.vault_task_queue`) runs everything that reads or writes the
  vault's git repository: the memory activities, the rollup and doctor workflows, and the
  tool calls that write a card (`workflows.options.VAULT_TOOLS`). One worker process serves
  it: it holds a PostgreSQL advisory lock for as long as it polls, so a second vault worker
  stands by until the first is gone, and git never sees two writers. On its beat it also
  indexes the hand edits of every scope's vault (`catch_up_hand_edits`), which recall no
  longer does per turn; beside it, the transcript outbox's drainer
  (activities.vault.outbox) writes the daily transcripts the sessions' model calls queued.
  When the lock's connection is lost it stops writing at once; a vault-only process then
  ends, and one serving both queues (`keel dev`) takes the lock again and serves the vault
  queue with a new worker (`_keep_vault`).
- The model backend is chosen here, once per process (`model_backends`): the real adapter,
  and the offline model for a provider profile with no key and no URL; every activity that
  asks the model is given it.
- MCP client sessions are kept warm by one pool per process (`activities.mcp_pool`), built
  here with the workers, handed to the MCP activities, and closed (every server process it
  started stopped) after the workers have stopped.
- The vault worker publishes CORE.md and schema.json to the workspace store
  (`activities.vault_share`), so session workers build their prompt without the vault.
- The session workflow runs under `workers.entry_guard.EntryGuard` (the SDK's sandbox
  inside), which sets right what the workflow's code cannot take: an Update no answer can
  carry, a run started with more than one argument.
- A served process (`serve_until`) freezes its heap once its workers poll: what start-up
  made (the modules of Temporal's SDK, pydantic, the model SDK, Keel's own) lives as long
  as the process, so the garbage collector's full passes stop walking it. Start-up's last
  step (`ready`: the memory schedules) runs beside the workers and never ends them; a
  worker that stops on its own (the SDK's fatal error) ends the process
  (`WorkerFailedError`), so its supervisor starts it again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from datetime import timedelta
from enum import StrEnum
from typing import Any

from temporalio.client import Client
from temporalio.worker import Interceptor, Worker

from activities.branch import BranchActivities
from activities.bundle_memory import BundleMemoryActivities
from activities.checkpoint import CheckpointActivities
from activities.context import SessionContext
from activities.delegate_ahead import child_closed
from activities.files import FileActivities
from activities.mcp import McpActivities
from activities.mcp_pool import McpPool
from activities.model import AnthropicBackend, ModelBackend, ModelBackends
from activities.offline import OfflineBackend
from activities.session import SessionActivities
from activities.tasks import stop_task
from activities.vault.cards import VaultActivities
from activities.vault.context import MemoryContext
from activities.vault.doctor import DoctorActivities
from activities.vault.erase import ScopeEraseActivities
from activities.vault.forget import ForgetCardActivities
from activities.vault.outbox import TranscriptDrainer
from activities.vault.rollup import RollupActivities
from activities.vault.turn import MemoryActivities, catch_up_hand_edits
from activities.vault_share import publish_vault_files
from activities.wakeups import create_wakeup_schedule, delete_wakeup_schedule
from activities.workspace import open_store
from schemas.config import KeelSettings
from schemas.mcp import McpReach
from schemas.session import Handler, TranscriptFailed
from schemas.tokens import warm_tokenizer
from workers.build_id import keel_build_id
from workers.bytecode import precompile_workflow_modules
from workers.entry_guard import EntryGuard, ignores_context
from workers.payload_refs import never_stores, worker_client
from workflows.branch import ForkWorkflow
from workflows.bundle_memory import BundleMemoryWorkflow
from workflows.doctor import DoctorWorkflow
from workflows.download import DownloadWorkflow
from workflows.erase_scope import EraseScopeWorkflow
from workflows.forget_card import ForgetCardWorkflow
from workflows.nightly import MemoryNightlyWorkflow
from workflows.rollup import ROLLUP_WORKFLOWS
from workflows.session import SessionWorkflow
from workflows.upload import UploadWorkflow
from workflows.wakeups import WakeupFireWorkflow

log = logging.getLogger("keel.worker")

# Everything long memory runs, for one worker registration.
MEMORY_WORKFLOWS: list[type] = [*ROLLUP_WORKFLOWS.values(), DoctorWorkflow,
                                 MemoryNightlyWorkflow]
# How often the vault worker checks its lock connection and republishes changed files.
VAULT_BEAT_S = 5.0
VAULT_BEAT_STOP_S = 5.0  # a grace of the beat's stop (activities.tasks)
# One advisory lock key space for vault ownership (the key is the vault queue's hash).
_VAULT_LOCK_CLASS = 7_246_002


class Role(StrEnum):
    SESSIONS = "sessions"  # `keel worker`: the session queue only
    VAULT = "vault"  # `keel worker --vault`: the vault queue only
    BOTH = "both"  # `keel dev`, the demo, tests: one process serves both


def model_backends() -> ModelBackends:
    """The model every activity of this process asks: the real adapter, and the offline
    model for the settings that name no key and no URL (`ModelSettings.offline`)."""
    return ModelBackends(real=AnthropicBackend(), offline=OfflineBackend())


def session_activities(context: SessionContext,
                       mcp_pool: McpPool | None = None) -> list[Callable[..., Any]]:
    """The session queue's activities, the session's and the checkpoint's over one
    session context (activities.context); the MCP ones over `mcp_pool` (none: a client
    session per activity) and the context's workspace store (for whole results)."""
    session = SessionActivities(context)
    checkpoint = CheckpointActivities(context)
    settings = context.settings
    mcp = McpActivities(mcp_pool, store=lambda: context.store, reach=McpReach(
        stdio_commands=settings.mcp_stdio_commands, http_hosts=settings.mcp_http_hosts))
    files = FileActivities(context.settings)
    branch = BranchActivities(context)
    return [
        branch.fork_session, branch.rewind_session,
        files.put_workspace_file, files.read_workspace_file, files.list_workspace_files,
        files.keep_tool_result, files.stage_upload_part, files.drop_upload,
        files.read_workspace_part,
        session.record_input, session.resolve_attachments, session.share_files,
        session.hand_back_files,
        session.hand_back_home,
        session.fence_seq,
        session.interrupt_model_call,
        session.call_model, session.run_tool, session.record_tool_result, session.read_reply,
        mcp.list_mcp_tools, mcp.call_mcp_tool,
        checkpoint.prepare_checkpoint, checkpoint.checkpoint_round,
        checkpoint.validate_checkpoint, checkpoint.store_checkpoint,
        checkpoint.move_earliest_half, checkpoint.checkpoint_texts,
        create_wakeup_schedule, delete_wakeup_schedule, child_closed,
    ]


def memory_activities(settings: KeelSettings, *, database_url: str | None = None,
                      ctx: MemoryContext | None = None,
                      model: ModelBackend | None = None) -> list[Callable[..., Any]]:
    """Every long-memory activity, bound to these settings (their `memory`), for one worker.

    `database_url` overrides `settings.database_url` (the embedded stack knows it only once
    it has started); `ctx` shares one context (its vaults' change caches) with the caller;
    `model` the process's model backend (else `model_backends()`).
    """
    if ctx is None:
        url = database_url or settings.database_url
        if not url:
            raise ValueError("memory activities need a database URL")
        ctx = MemoryContext(settings=settings, database_url=url)
    vault = VaultActivities(ctx)
    model = model or model_backends()
    turn = MemoryActivities(ctx, model)
    rollup = RollupActivities(ctx, model)
    doctor = DoctorActivities(ctx)
    bundle = BundleMemoryActivities(ctx)
    erase = ScopeEraseActivities(ctx)
    forget = ForgetCardActivities(ctx)
    return [
        vault.init_vault, vault.reindex_vault, vault.write_card, vault.list_memory_scopes,
        bundle.stage_bundle_memory, bundle.write_bundle_memory, bundle.forget_session_memory,
        erase.erase_memory_scope, forget.forget_memory_card,
        turn.recall_memory, turn.flush_memory, turn.append_transcript, turn.append_transcripts,
        rollup.plan_rollup_periods, rollup.plan_rollup, rollup.apply_rollup, rollup.notify,
        rollup.commit_vault,
        doctor.doctor_enforce, doctor.doctor_graph, doctor.doctor_decay, doctor.doctor_moc,
        doctor.doctor_scans, doctor.doctor_core_check, doctor.doctor_reindex,
    ]


def vault_activities(context: SessionContext,
                     ctx: MemoryContext | None = None) -> list[Callable[..., Any]]:
    """The vault queue's activities: long memory, and run_tool for the card-writing tools
    (over the process's one session context)."""
    return [*memory_activities(context.settings, ctx=ctx, model=context.model),
            SessionActivities(context).run_tool]


class KeelWorkers:
    """The Temporal workers of one process for its role, started and stopped together.

    `async with build_worker(...)`: on entry the session worker polls at once; then the
    vault worker takes the vault lock (waiting, as a stand-by, while another process holds
    it), so entry returns only when the vault queue is served too.
    """

    def __init__(self, client: Client, settings: KeelSettings, role: Role,
                 interceptors: Sequence[Interceptor],
                 activity_executor: concurrent.futures.Executor | None,
                 wait_for_vault: bool = True) -> None:
        self.client, self.settings, self.role = client, settings, role
        self.wait_for_vault = wait_for_vault
        self.serves_vault = False
        self.workers: list[Worker] = []
        # Built once: the session's and the checkpoint's activities (and the vault
        # queue's run_tool) share its pool access, store, prompt and window loader.
        self.context = SessionContext(settings, model=model_backends())
        # Warm MCP sessions for the session queue's MCP activities; closed on exit.
        self.mcp_pool = McpPool()
        # Set when a worker stops on its own (`serve_until` ends the process).
        self.failed = asyncio.Event()
        self.failure: BaseException | None = None
        common: dict[str, Any] = {"interceptors": list(interceptors),
                                  "activity_executor": activity_executor,
                                  "build_id": keel_build_id(),
                                  "on_fatal_error": self._fatal,
                                  # A stop lets the calls in flight finish, up to this.
                                  "graceful_shutdown_timeout": timedelta(
                                      seconds=settings.shutdown_grace_s)}
        if role in (Role.SESSIONS, Role.BOTH):
            # Every new session (a child's too) imports these afresh: compile them once.
            precompile_workflow_modules([SessionWorkflow, ForkWorkflow, WakeupFireWorkflow,
                                         UploadWorkflow, DownloadWorkflow])
            self.workers.append(Worker(
                client, task_queue=settings.task_queue,
                workflows=[SessionWorkflow, ForkWorkflow, WakeupFireWorkflow, UploadWorkflow,
                           DownloadWorkflow,
                           BundleMemoryWorkflow, EraseScopeWorkflow, ForgetCardWorkflow],
                activities=session_activities(self.context, self.mcp_pool),
                max_concurrent_activities=50, workflow_runner=EntryGuard(
                    context_free=ignores_context(client.data_converter)
                    and never_stores(client.data_converter)), **common))
        self._common = common
        self._stack = contextlib.AsyncExitStack()
        self._memory: MemoryContext | None = None  # the vault worker's, for its beat
        self.drainer: TranscriptDrainer | None = None  # the vault's transcript outbox
        # What serves the vault queue now (its lock, worker, drainer and beat); set when
        # the beat lost the lock's connection, for `_keep_vault` to serve it again.
        self._vault_stack = contextlib.AsyncExitStack()
        self._vault_lost = asyncio.Event()
        self._keeper: asyncio.Task[None] | None = None

    async def __aenter__(self) -> KeelWorkers:
        # Closed last: after every worker, and so every MCP activity and model call, has
        # stopped.
        self._stack.push_async_callback(self.context.model.aclose)
        self._stack.push_async_callback(self.mcp_pool.close)
        try:
            for worker in self.workers:  # the session queue first: it needs no lock
                await self._stack.enter_async_context(worker)
            if self.role in (Role.VAULT, Role.BOTH):
                self._stack.push_async_callback(self._stop_vault)
                self.serves_vault = await self._serve_vault()
            if self.role is Role.BOTH and self.wait_for_vault:
                self._keeper = asyncio.create_task(self._keep_vault())
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _serve_vault(self, *, again: bool = False) -> bool:
        """Take the vault lock (`_vault_owner`) and serve the vault queue: its worker (built
        only now: Temporal registers it when built) and the transcript outbox's drainer,
        all held by `_vault_stack`. False: not served."""
        stack = contextlib.AsyncExitStack()
        try:
            if not await stack.enter_async_context(self._vault_owner(again=again)):
                await stack.aclose()
                return False
            assert self.settings.database_url
            if self._memory is None:
                self._memory = MemoryContext(settings=self.settings,
                                             database_url=self.settings.database_url)
            vault = Worker(
                self.client, task_queue=self.settings.vault_task_queue,
                workflows=MEMORY_WORKFLOWS,
                activities=vault_activities(self.context, self._memory),
                max_concurrent_activities=50, **self._common)
            self.workers.append(vault)
            stack.callback(self.workers.remove, vault)
            await stack.enter_async_context(vault)
            # Stopped before the vault worker is (the exit stack runs backwards).
            self.drainer = TranscriptDrainer(
                self.settings.database_url, self.settings.vault_task_queue,
                MemoryActivities(self._memory, self.context.model), self._transcript_failed)
            await stack.enter_async_context(self.drainer.running())
        except BaseException:
            await stack.aclose()
            raise
        self._vault_stack = stack
        return True

    async def _keep_vault(self) -> None:
        """One process serving both queues: the vault queue served again whenever it is
        not (its lock's connection lost when PostgreSQL restarted, or PostgreSQL away at
        start), once the lock can be taken; a stand-by waits for it inside."""
        while True:
            if self.serves_vault:
                await self._vault_lost.wait()
                self._vault_lost.clear()
                await self._vault_stack.aclose()
                self.serves_vault = False
            await asyncio.sleep(VAULT_BEAT_S)
            try:
                self.serves_vault = await self._serve_vault(again=True)
            except Exception as err:  # PostgreSQL still away: the next beat tries again
                log.debug("the vault queue is not served yet: %s", err)
                continue
            if self.serves_vault:
                log.warning("the vault queue %s is served again", self.settings.vault_task_queue)

    async def _stop_vault(self) -> None:
        if self._keeper is not None:
            await stop_task(self._keeper, grace_s=VAULT_BEAT_STOP_S, what="the vault keeper")
        await self._vault_stack.aclose()

    async def _fatal(self, err: BaseException) -> None:
        log.error("a worker stopped polling: %s", err)
        self.failure = self.failure or err
        self.failed.set()

    async def _transcript_failed(self, session_id: str, message: str) -> None:
        """Tell a session its queued transcript could not be written (workflows.transcript)."""
        await self.client.get_workflow_handle(session_id).signal(
            Handler.TRANSCRIPT_FAILED, TranscriptFailed(message=message))

    @contextlib.asynccontextmanager
    async def _vault_owner(self, *, again: bool = False) -> AsyncIterator[bool]:
        """Hold the vault lock while the vault worker runs; publish the shared files.
        Yields False (and holds nothing) when the lock is taken and we may not wait.
        `again`: the keeper's retry, which raises while PostgreSQL is away."""
        import psycopg

        settings = self.settings
        assert settings.database_url, "the vault worker needs DATABASE_URL"
        try:
            conn = await psycopg.AsyncConnection.connect(settings.database_url,
                                                         autocommit=True)
        except psycopg.OperationalError as err:
            if self.role is Role.VAULT or again:
                raise  # a vault worker that cannot prove it owns the vault does not start
            # One process serving both: the sessions run; long memory waits for PostgreSQL
            # (`_keep_vault`; its activities give up after MEMORY_TURN's deadline meanwhile,
            # turns go on).
            log.error("vault queue %s not served: PostgreSQL unreachable (%s)",
                      settings.vault_task_queue, err)
            yield False
            return
        key = (_VAULT_LOCK_CLASS, settings.vault_task_queue)
        try:
            waited = False
            while not (await (await conn.execute(
                    "SELECT pg_try_advisory_lock(%s, hashtext(%s))", key)).fetchone() or
                       [False])[0]:
                if not self.wait_for_vault:
                    log.warning("another vault worker holds %s: not serving it here",
                                settings.vault_task_queue)
                    yield False
                    return
                if not waited:
                    log.warning("another vault worker holds %s: standing by",
                                settings.vault_task_queue)
                    waited = True
                await asyncio.sleep(VAULT_BEAT_S)
            if waited:
                log.warning("vault lock taken: this worker now serves %s",
                            settings.vault_task_queue)
            # Each scope's vault is made from the template on its first use, by the vault
            # activities; what exists now is published for the session workers.
            store = open_store(settings)
            await publish_vault_files(settings, store)
            beat = asyncio.create_task(self._beat(conn, store))
            try:
                yield True
            finally:
                await stop_task(beat, grace_s=VAULT_BEAT_STOP_S, what="the vault's beat")
        finally:
            await conn.close()  # the lock goes with the connection

    async def _beat(self, conn: Any, store: Any) -> None:
        while True:
            await asyncio.sleep(VAULT_BEAT_S)
            try:
                await conn.execute("SELECT 1")
                await publish_vault_files(self.settings, store)
            except Exception as err:
                # The lock may be gone with the connection: stop writing the vault now,
                # before a stand-by that took the lock starts writing it too.
                if self.role is Role.VAULT:
                    log.error("vault lock connection lost (%s): stopping the vault worker",
                              err)
                else:  # `_keep_vault` serves the vault again once it holds the lock again
                    log.warning("vault lock connection lost (%s): the vault worker stops "
                                "until this process holds the lock again", err)
                if self.drainer is not None:
                    await self.drainer.stop()
                for worker in self.workers:
                    if worker.task_queue == self.settings.vault_task_queue:
                        await worker.shutdown()
                if self.role is Role.VAULT:  # it serves nothing now: its process ends, and
                    # started again it waits for PostgreSQL and takes the lock (or stands by)
                    await self._fatal(RuntimeError(f"the vault lock connection was lost "
                                                   f"({err})"))
                self._vault_lost.set()  # one process serving both: `_keep_vault` takes it
                return
            if self._memory is not None:
                try:
                    await catch_up_hand_edits(self._memory)
                except Exception as err:  # the next beat tries again; turns are not held up
                    log.warning("indexing the vaults' hand edits failed: %s", err)


class WorkerFailedError(RuntimeError):
    """A worker of this process stopped polling for good (the SDK's fatal error): the
    process ends, so whatever supervises it starts it again, never a process that lives on
    serving nothing."""


async def serve_until(workers: KeelWorkers, stop: asyncio.Event,
                      ready: Callable[[], Coroutine[Any, Any, None]]) -> bool:
    """Run `workers` until `stop` is set, calling `ready` once they all poll (beside
    them: a `ready` still waiting on a server does not hold them up, and its failure is
    logged, not fatal). A stand-by vault worker waits for the lock inside; `stop` ends the
    wait too. False: stopped before the workers were ready. `WorkerFailedError` when a
    worker stops on its own."""
    entering = asyncio.create_task(workers.__aenter__())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([entering, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not entering.done():
        entering.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await entering
        return False
    entering.result()
    # Start-up's objects (~270k) out of the collector's way: a full pass over them holds
    # the process (every task and activity in it) for ~130 ms; frozen, ~0.
    gc.collect()
    gc.freeze()
    readying = asyncio.create_task(ready())
    readying.add_done_callback(_log_failure)
    failing = asyncio.create_task(workers.failed.wait())
    try:
        await asyncio.wait([stopping, failing], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (readying, stopping, failing):
            task.cancel()
        await workers.__aexit__(None, None, None)
    if workers.failure is not None and not stop.is_set():
        raise WorkerFailedError(f"a worker stopped: {workers.failure}") from workers.failure
    return True


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("start-up's last step failed: %s", task.exception())


def build_worker(client: Client, settings: KeelSettings,
                 interceptors: Sequence[Interceptor] = (),
                 activity_executor: concurrent.futures.Executor | None = None,
                 role: Role = Role.BOTH, wait_for_vault: bool = True) -> KeelWorkers:
    """The workers of `role`; with `wait_for_vault=False` the vault queue is served only
    when no other process owns it (the demo beside a running cluster)."""
    warm_tokenizer()  # its file loaded now, not inside a workflow task
    # Payload references another client's external storage wrote are read as unresolved
    # payloads, never a failed task (workers.payload_refs).
    return KeelWorkers(worker_client(client), settings, role, interceptors,
                       activity_executor, wait_for_vault)
