"""Faults a delegation test (or the history recorder) injects into a real worker: the
child's model call cannot tell its parent, and the parent's model call that started the
child loses its completion once, after that child has ended.

Invariant: each fault is off until armed (`armed()` true), and the lost completion is lost
once (`lost` names the child it had started); nothing else of the worker changes.

    faults = DelegationFaults(armed=lambda: True)
    client = faults.client(temporal_client)       # for the worker
    async with build_worker(client, settings, interceptors=[faults]):
        ...
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.client import (
    Client,
    OutboundInterceptor,
    SignalWorkflowInput,
    WorkflowExecutionStatus,
)
from temporalio.client import Interceptor as ClientInterceptor
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from schemas.session import Handler

__all__ = ["DelegationFaults"]


class DelegationFaults(Interceptor):
    """The worker's interceptor (activities); `client` gives the worker's client."""

    def __init__(self, armed: Callable[[], bool]) -> None:
        self.armed = armed
        self.lost: list[str] = []  # the child whose starting call lost its completion

    def client(self, client: Client) -> Client:
        """`client` with its signals through these faults (the worker's, for activities).
        Not this object itself: a client's interceptor that is a worker's too is taken by
        the worker as well, and would intercept every activity twice."""
        config = client.config()
        config["interceptors"] = [_ClientFaults(self)]
        return Client(**config)

    def intercept_activity(self, next: ActivityInboundInterceptor,
                           ) -> ActivityInboundInterceptor:
        return _LoseOnce(next, self)


class _ClientFaults(ClientInterceptor):
    def __init__(self, faults: DelegationFaults) -> None:
        self.faults = faults

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        return _NoChildAnswer(next, self.faults)


class _NoChildAnswer(OutboundInterceptor):
    def __init__(self, next: OutboundInterceptor, faults: DelegationFaults) -> None:
        super().__init__(next)
        self.faults = faults

    async def signal_workflow(self, input: SignalWorkflowInput) -> None:
        if input.signal == Handler.CHILD_ANSWER and self.faults.armed():
            raise RuntimeError("a fault injected: a child's model call's answer is refused")
        await super().signal_workflow(input)


class _LoseOnce(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, faults: DelegationFaults) -> None:
        super().__init__(next)
        self.faults = faults

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        result = await self.next.execute_activity(input)
        started = getattr(result, "started_ahead", None)
        if self.faults.lost or not started or not self.faults.armed():
            return result
        [child] = started.values()
        self.faults.lost.append(child)
        handle = activity.client().get_workflow_handle(child)
        for _ in range(300):  # the child answers its parent at its end, and ends
            if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
                break
            await asyncio.sleep(0.1)
        raise ApplicationError("a fault injected: this call's completion is lost")
