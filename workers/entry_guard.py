"""What the session's workflow code cannot take however it is written, set right before it
sees it: an Update no answer can carry, and a run started with more than one argument.

An Update's acceptance and its rejection both carry its request (sdk-core's update machine
puts the original request in either message), so an Update whose request is near
Temporal's blob limit cannot be answered at all: the answer fails the workflow task
([TMPRL1103]), the server delivers the Update again with every retry and then backs off,
and for ~20 s the session takes no other Update ("Workflow Task in failed state"). Keel's
own client refuses such a message before sending it (`schemas.text.payload_problem`); this
is for every other client.

A run started with two arguments or more would fail every workflow task: the SDK calls
the workflow's `__init__` with each of them, and it takes one (signals take any number,
through one dynamic handler; an Update's validator refuses a wrong count).

Invariants:
- The session's workflow runner is `EntryGuard` (the SDK's sandbox inside). An Update whose
  request is over `ECHO_LIMIT_BYTES` is left out of the activation the workflow sees, and
  logged with its size and the limit. Unanswered, it does not fail the task; the server
  rejects it to its caller as unprocessed ("UnprocessedUpdate"), and the next message is
  answered at once (tests/session/test_large_payloads.py). Nothing of it reaches the
  history, so every replay is the same.
- A run's arguments, when there are two or more, become one payload of encoding
  `ARGUMENTS_ENCODING` holding their count, which the workflow refuses with that count
  (workflows.entry): the run fails with the reason. The same history replays the same on
  every Keel worker.
- Nothing else in an activation is touched.
- A worker whose data converter reads every payload the same whatever its serialization
  context (`ignores_context`) and keeps nothing in external storage (Keel's: the pydantic
  converter reading payload references) is told there is no serialization context and an
  empty store context: the SDK asks the instance for both for every payload of every
  activation, and the sandbox answers each by compiling and running code inside it (about
  a tenth of a session worker's CPU in a plain turn). No answer could change a payload.
- The sandbox inside passes Keel's own packages through (`PASSED_THROUGH`): a new workflow
  instance (a session's start, a child's, every continue-as-new) uses the worker's loaded
  modules instead of executing workflows/session.py again, with its workflow definition
  (13-20 ms of CPU per instance on the 2-core machine, on a child's first workflow task;
  0.7 ms after). Every module the workflow imports was passed through already (its imports
  sit in `imports_passed_through`), so the only code this takes out of the sandbox's
  restrictions is the workflow module's own; the replay tests and `keel history` replay
  in the SDK's default sandbox, which still imports it afresh under its restrictions.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.bridge.proto.workflow_activation import DoUpdate, WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    SerializationContext,
    StorageDriverStoreContext,
    WorkflowSerializationContext,
)
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from schemas.session import ARGUMENTS_ENCODING
from schemas.text import TEMPORAL_BLOB_LIMIT_BYTES

__all__ = ["ECHO_LIMIT_BYTES", "PASSED_THROUGH", "EntryGuard", "ignores_context",
           "update_size"]

log = logging.getLogger("keel.worker")


# An Update whose request is this large cannot be answered at all: its acceptance and its
# rejection both carry the request (sdk-core's update machine), over the blob limit.
ECHO_LIMIT_BYTES = TEMPORAL_BLOB_LIMIT_BYTES - 64 * 1024


def update_size(job: DoUpdate) -> int:
    """The bytes an answer to `job` would echo: its input payloads, name and headers."""
    return (sum(p.ByteSize() for p in job.input) + len(job.name.encode())
            + sum(len(k) + v.ByteSize() for k, v in job.headers.items()))


def ignores_context(converter: DataConverter) -> bool:
    """Whether `converter` is the same under every serialization context (no part of it
    takes one)."""
    probes: list[SerializationContext] = [
        WorkflowSerializationContext(namespace="", workflow_id=""),
        ActivitySerializationContext(namespace="", activity_id="", activity_type="",
                                     activity_task_queue="", workflow_id="",
                                     workflow_type="", is_local=False)]
    return all(converter.with_context(probe) is converter for probe in probes)


class _Guarded(WorkflowInstance):
    """A workflow instance that never sees an Update it could not answer nor a run's extra
    arguments (see `EntryGuard`); everything else is the wrapped instance's."""

    def __init__(self, inner: WorkflowInstance, context_free: bool = False) -> None:
        self.inner = inner
        self.context_free = context_free

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        kept = []
        for job in act.jobs:
            if job.HasField("initialize_workflow") \
                    and len(arguments := job.initialize_workflow.arguments) > 1:
                count = len(arguments)
                del arguments[:]
                arguments.append(Payload(metadata={"encoding": ARGUMENTS_ENCODING},
                                         data=str(count).encode()))
            if job.HasField("do_update") and (size := update_size(job.do_update)) \
                    > ECHO_LIMIT_BYTES:
                log.warning(
                    "refused Update %r (id %s) of workflow %s: its request is %d bytes, over "
                    "the %d bytes an answer can echo (Temporal's blob limit is %d); the "
                    "server rejects it as unprocessed", job.do_update.name,
                    job.do_update.id, act.run_id, size, ECHO_LIMIT_BYTES,
                    TEMPORAL_BLOB_LIMIT_BYTES)
                continue
            kept.append(job)
        if len(kept) != len(act.jobs):
            del act.jobs[:]
            act.jobs.extend(kept)
        return self.inner.activate(act)

    def get_serialization_context(self, command_info: Any) -> Any:
        if self.context_free:  # no payload could read differently: do not ask the sandbox
            return None
        return self.inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        if self.context_free:  # nothing is stored: no target could matter
            return StorageDriverStoreContext()
        return self.inner.get_external_store_context(command_info)

    def get_info(self) -> Any:
        return self.inner.get_info()

    def __getattr__(self, name: str) -> Any:  # get_thread_id and what else the worker asks
        return getattr(self.inner, name)


# Keel's packages: deterministic by Keel's own rules (workflows), or used by the workflow
# only through `imports_passed_through` already (schemas, activities).
PASSED_THROUGH = ("workflows", "schemas", "activities")


def keel_sandbox() -> SandboxedWorkflowRunner:
    """The SDK's sandbox, Keel's packages passed through (see the invariant above)."""
    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSED_THROUGH))


@dataclasses.dataclass
class EntryGuard(WorkflowRunner):
    """The session's workflow runner (the SDK's sandbox inside): an Update whose request is
    over `ECHO_LIMIT_BYTES` is taken out of its activation before the workflow sees it, and
    a run's arguments, when more than one, become their count."""

    inner: WorkflowRunner = dataclasses.field(default_factory=keel_sandbox)
    # The worker's converter ignores serialization contexts (`ignores_context`) and keeps
    # nothing in external storage.
    context_free: bool = False

    def prepare_workflow(self, defn: Any) -> None:
        self.inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _Guarded(self.inner.create_instance(det), self.context_free)

    def set_worker_level_failure_exception_types(
            self, types: Sequence[type[BaseException]]) -> None:
        self.inner.set_worker_level_failure_exception_types(types)
