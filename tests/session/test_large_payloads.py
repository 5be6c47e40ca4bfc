"""Issue 11, defect 5's last part: an input over Temporal's 2 MiB blob limit from a client
that is not Keel's helper (another SDK, `temporal workflow update`, the Python SDK with
plain JSON). Tried against the real dev server and SDK; what these tests show:

- An Update's acceptance and its rejection both carry the original request: sdk-core
  builds them (`update_state_machine.rs`: `rejected_request: Some(orig)`) from the request
  as the server delivered it, after the workflow's completion has passed the data
  converter. So no worker-side setting reaches it: not external storage, not a payload
  codec (the converter never sees the echo: `test_no_worker_setting_can_reject_it`), and
  not `disable_payload_error_limit` (the server's own check then fails the task). The
  workflow task fails ("[TMPRL1103] ... messages[0].body") whatever the validator says.
- The supported way is at the sender: a client whose converter keeps large payloads in
  external storage sends a small reference, and the same validator then rejects it
  cleanly, at once (`test_external_storage_at_the_sender_gets_a_clean_rejection`). Keel's
  own client goes further and refuses before sending (test_edge_inputs.py).
- A payload reference a reader cannot resolve would fail every attempt of its task
  ([TMPRL1105]): a signal carrying one would stop the session for good. A Keel worker
  reads it as an unresolved payload (workers.payload_refs): an Update carrying one is
  rejected (its argument does not decode), a signal carrying one leaves a malformed-signal
  notice (`test_a_reference_a_keel_worker_cannot_resolve_is_refused_not_a_failed_task`).
- A signal over the limit never reaches the worker: the server refuses it to its sender.
- What a Keel session does with a plain 3 MB Update: its worker leaves it out of the
  activation (workers.entry_guard: no answer could carry it), so no task fails; the
  server rejects it to its caller at once as unprocessed, nothing of it is recorded, and
  the next message is answered at once, with no wait for a task retry
  (`test_a_plain_3mb_update_leaves_the_session_whole`).
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
import pytest
from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from tests.fake_anthropic import text_message
from tests.harness import keel_worker, make_settings
from workers.payload_refs import worker_converter
from workflows.session import SessionWorkflow

T = TypeVar("T")
THREE_MB = 3_000_000
LIMIT = 1_000_000  # the probe's validator: the same kind of rule as Keel's payload_problem
# What the sender of an Update gets when the workflow task carrying it failed: "due to
# Workflow Task in failed state" or "due to unexpected workflow task failure".
FAILED_TASK = r"(?i)workflow task (in failed state|failure)"


@pytest.fixture
def settings(database_url, fake_anthropic, tmp_path):
    return make_settings(database_url, tmp_path, fake_anthropic.base_url)


def plain_json(client: Client) -> Client:
    """A client with Temporal's default JSON converter, as another SDK would send."""
    return Client(client.service_client, namespace=client.namespace)


class MemoryDriver(StorageDriver):
    """External storage in this process's memory: enough to show where payloads go."""

    def __init__(self) -> None:
        self.blobs: dict[str, Payload] = {}
        self.stored: list[int] = []  # the sizes of the payloads it was asked to keep

    def name(self) -> str:
        return "test-memory"

    async def store(self, context: StorageDriverStoreContext,
                    payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        claims = []
        for p in payloads:
            key = uuid.uuid4().hex
            self.blobs[key] = p
            self.stored.append(p.ByteSize())
            claims.append(StorageDriverClaim(claim_data={"key": key}))
        return claims

    async def retrieve(self, context: StorageDriverRetrieveContext,
                       claims: Sequence[StorageDriverClaim]) -> list[Payload]:
        return [self.blobs[c.claim_data["key"]] for c in claims]


def with_storage(client: Client, driver: MemoryDriver) -> Client:
    converter = DataConverter(external_storage=ExternalStorage(
        drivers=[driver], payload_size_threshold=LIMIT))
    return Client(client.service_client, namespace=client.namespace,
                  data_converter=converter)


@workflow.defn(name="PayloadProbe")
class PayloadProbe:
    """An Update with a size rule in its validator, and nothing else."""

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.update
    async def send(self, text: str) -> int:
        return len(text)

    @send.validator
    def check(self, text: str) -> None:
        if len(text) > LIMIT:
            raise ApplicationError(f"the text has {len(text)} characters, more than {LIMIT}",
                                   non_retryable=True)


async def answered(call: Callable[[], Awaitable[T]], tries: int = 60) -> T:
    """`call`'s answer once the failed workflow task has been retried by the server (until
    then an Update is refused with FAILED_TASK): a bounded wait, one try a second."""
    for _ in range(tries - 1):
        try:
            return await call()
        except RPCError as err:
            assert re.search(FAILED_TASK, str(err)), err
            await asyncio.sleep(1)
    return await call()


async def probe(worker_client: Client, sender: Client, **worker_options: Any) -> Exception:
    """Start the probe on a fresh queue, send it 3 MB, and return what the sender got."""
    queue = f"probe-{uuid.uuid4().hex[:8]}"
    async with Worker(worker_client, task_queue=queue, workflows=[PayloadProbe],
                      workflow_runner=UnsandboxedWorkflowRunner(),
                      **worker_options):
        handle = await worker_client.start_workflow(
            PayloadProbe.run, id=f"probe-{uuid.uuid4().hex[:8]}", task_queue=queue,
            run_timeout=timedelta(minutes=5))
        try:
            assert await handle.execute_update(PayloadProbe.send, "warm") == 4
            with pytest.raises((RPCError, WorkflowUpdateFailedError)) as failed:
                await asyncio.wait_for(sender.get_workflow_handle(handle.id).execute_update(
                    "send", "x" * THREE_MB), 90)
            assert await answered(lambda: handle.execute_update(PayloadProbe.send, "fine")) == 4
        finally:
            await handle.terminate()
    return failed.value


async def test_no_worker_setting_can_reject_it(client):
    """The worker's converter is never asked to store the echo: the task fails on it,
    whatever the setting. The settings are tried at once, each on a worker and a queue of
    its own (two wait ~20 s for the server to end the caller's request)."""
    async def tried(setting: str) -> None:
        driver = MemoryDriver()
        worker_client = with_storage(client, driver) if setting == "external storage" \
            else client
        options = {"disable_payload_error_limit": True} if setting.startswith("no") else {}
        err = await probe(worker_client, plain_json(client), **options)
        assert isinstance(err, RPCError) and re.search(FAILED_TASK, str(err)), (setting, err)
        assert not any(size >= LIMIT for size in driver.stored), setting

    await asyncio.gather(*(tried(s) for s in ("none", "external storage",
                                              "no payload error limit")))


async def test_external_storage_at_the_sender_gets_a_clean_rejection(client):
    """The sender keeps the 3 MB in external storage; the request (and so its echo) holds
    a reference; the validator's rejection reaches the caller at once."""
    driver = MemoryDriver()
    started = time.monotonic()
    err = await probe(with_storage(client, driver), with_storage(client, driver))
    assert isinstance(err, WorkflowUpdateFailedError)
    assert f"the text has {THREE_MB} characters" in str(err.cause)
    assert time.monotonic() - started < 10
    assert driver.stored and max(driver.stored) > THREE_MB  # it travelled as a reference


async def test_a_reference_a_keel_worker_cannot_resolve_is_refused_not_a_failed_task(
        client, settings, fake_anthropic, database_url):
    """A client with external storage the Keel worker does not have: the Update is
    rejected (its argument does not decode), the signal leaves a notice; the session goes
    on and nothing of either is recorded as input."""
    fake_anthropic.responder = lambda body: text_message("still here")
    sender = with_storage(client, MemoryDriver())
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"ref-{uuid.uuid4().hex[:8]}")
        handle = sender.get_workflow_handle(session.session_id)
        started = time.monotonic()
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update("send_message", {"text": "y" * THREE_MB})
        assert time.monotonic() - started < 10
        await handle.signal("watch", {"watch_id": "w", "name": "CI", "text": "z" * THREE_MB})
        for _ in range(200):
            status = await session.status()
            if status.last_error:
                break
            await asyncio.sleep(0.05)
        outcome = await session.ask("hello")
        history = await session.handle.fetch_history()
    assert status.last_error and "malformed watch signal" in status.last_error
    assert "keel/unresolved-reference" in status.last_error
    # The history holds the foreign references; the worker's converter replays it as it ran.
    replayer = Replayer(workflows=[SessionWorkflow],
                        data_converter=worker_converter(pydantic_data_converter))
    assert (await replayer.replay_workflow(history)).replay_failure is None
    assert outcome.reply_text == "still here"
    with psycopg.connect(database_url) as conn:
        kinds = [r[0] for r in conn.execute(
            "SELECT type FROM messages WHERE session_id=%s ORDER BY seq",
            (session.session_id,)).fetchall()]
    assert kinds == ["notice", "user", "assistant"]


# One handler stands for all: the echo is sdk-core's, the same for every Update whatever
# its handler (set_agent and decide_approval were run this way too: the same outcome), and
# each case waits ~20 s for the server to end the caller's request.
@pytest.mark.parametrize("update, argument", [
    ("send_message", {"text": "y" * THREE_MB}),
    ("set_agent", {"instructions": "y" * THREE_MB}),
])
async def test_a_plain_3mb_update_leaves_the_session_whole(
        client, settings, fake_anthropic, database_url, update, argument):
    """A plain-JSON 3 MB Update, and a 3 MB Watch: the Update is rejected to its caller at
    once (by the server, as unprocessed: the worker left it out), the signal is refused to
    its sender by the server; nothing is recorded, no workflow task fails, and the next
    message is answered at once."""
    fake_anthropic.responder = lambda body: text_message("small is fine")
    async with keel_worker(client, settings) as keel:
        session = await keel.start_session(f"big-{uuid.uuid4().hex[:8]}")
        handle = plain_json(client).get_workflow_handle(session.session_id)
        started = time.monotonic()
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await asyncio.wait_for(handle.execute_update(update, argument), 90)
        assert isinstance(refused.value.cause, ApplicationError)
        assert refused.value.cause.type == "UnprocessedUpdate"
        with pytest.raises(RPCError, match="Blob data size exceeds limit"):
            await handle.signal("watch", {"watch_id": "w", "name": "CI",
                                          "text": "z" * THREE_MB})
        outcome = await session.ask("small")  # at once: no task to wait for
        assert time.monotonic() - started < 10
        status = await session.status()
        history = await session.handle.fetch_history()
    assert outcome.reply_text == "small is fine"
    assert status.last_error is None
    assert not [e for e in history.events
                if e.HasField("workflow_task_failed_event_attributes")]
    with psycopg.connect(database_url) as conn:
        texts = [r[0] for r in conn.execute(
            "SELECT content_text FROM messages WHERE session_id=%s ORDER BY seq",
            (session.session_id,)).fetchall()]
    assert texts == ["small", "small is fine"]
