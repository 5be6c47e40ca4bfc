"""The service side of service tools: write a typed async function, get its declaration
and the activity to register on your own worker.

    tools = ServiceToolset(task_queue="support-tools")

    @tools.tool(description="Look up an order by its id.")
    async def lookup_order(order_id: str) -> dict:
        ...

    @tools.tool(description="Refund an order.", approval="ask")
    async def refund(order_id: str, amount_cents: int, call: ServiceToolCall) -> str:
        ...   # call.session_id, call.call_id: an idempotency key for the refund

    @tools.tool(description="Chart an order's history.")
    async def chart(order_id: str) -> ServiceToolResult:
        return ServiceToolResult(text="...", files=[ToolFile(name="chart.png", data=png)])

    spec = AgentSpec(instructions=..., tools=tools.declarations())
    Worker(client, task_queue="support-tools", activities=tools.activities())

Invariants:
- The input schema is pydantic's JSON schema of the function's parameters (or of its one
  pydantic-model parameter); a parameter typed `ServiceToolCall` gets the call itself and is
  not part of the schema.
- The activity validates its input against the same model: a mismatch is an error result
  naming the field, never an exception; what the function raises fails the activity (Keel
  turns it into an error result for the model).
- A result's files (`ToolFile`: images, PDFs, UTF-8 text) reach the model with the result,
  as a message's files do; one it would refuse is a line of the result saying why.
- Imports only temporalio, pydantic and `schemas.agent`: no Keel worker code.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, get_type_hints

from pydantic import BaseModel, ValidationError, create_model
from temporalio import activity

from schemas.agent import (
    ApprovalPolicy,
    ServiceTool,
    ServiceToolCall,
    ServiceToolResult,
    ToolFile,
)
from schemas.strict import first_problem

__all__ = ["ServiceToolCall", "ServiceToolResult", "ServiceToolset", "ToolFile"]

ACTIVITY_PREFIX = "keel-tool."


def _input_model(fn: Callable[..., Any]) -> tuple[type[BaseModel], bool, str | None]:
    """(the input model, whether it is the function's one model parameter, the name of the
    parameter that receives the ServiceToolCall)."""
    hints = get_type_hints(fn)
    params = [p for p in inspect.signature(fn).parameters.values()]
    call_param = next((p.name for p in params if hints.get(p.name) is ServiceToolCall), None)
    inputs = [p for p in params if p.name != call_param]
    if len(inputs) == 1:
        hint = hints.get(inputs[0].name)
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            return hint, True, call_param
    fields: dict[str, Any] = {}
    for p in inputs:
        if p.name not in hints:
            raise TypeError(f"{fn.__name__}: parameter {p.name!r} needs a type hint")
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (hints[p.name], default)
    model = create_model(f"{fn.__name__}_input", **fields)
    return model, False, call_param


def _to_result(value: Any) -> ServiceToolResult:
    if isinstance(value, ServiceToolResult):
        return value
    if isinstance(value, str):
        return ServiceToolResult(text=value)
    if isinstance(value, BaseModel):
        return ServiceToolResult(data=value.model_dump(mode="json"))
    return ServiceToolResult(data=value)


class ServiceToolset:
    """A service's tools: their declarations for the agent spec and their activities for
    the service's own worker on `task_queue`."""

    def __init__(self, task_queue: str) -> None:
        self.task_queue = task_queue
        self._tools: list[ServiceTool] = []
        self._activities: list[Callable[..., Any]] = []

    def tool(self, *, name: str | None = None, description: str | None = None,
             approval: ApprovalPolicy | str = ApprovalPolicy.ALLOW, timeout_s: float = 60.0,
             schedule_to_close_s: float = 300.0, max_attempts: int = 1,
             output_cap_chars: int = 20_000,
             ) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
        def wrap(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            tool_name = name or fn.__name__
            model, whole, call_param = _input_model(fn)
            schema = model.model_json_schema()
            schema.pop("title", None)
            self._tools.append(ServiceTool(
                name=tool_name, description=description or inspect.getdoc(fn) or "",
                input_schema=schema, activity=ACTIVITY_PREFIX + tool_name,
                task_queue=self.task_queue, timeout_s=timeout_s,
                schedule_to_close_s=schedule_to_close_s, max_attempts=max_attempts,
                approval=ApprovalPolicy(approval), output_cap_chars=output_cap_chars))

            @activity.defn(name=ACTIVITY_PREFIX + tool_name)
            async def run(call: ServiceToolCall) -> ServiceToolResult:
                try:
                    args = model.model_validate(call.input)
                except ValidationError as err:
                    return ServiceToolResult(
                        text=f"the input does not match: {first_problem(err)}", is_error=True)
                kwargs: dict[str, Any] = {}
                if whole:
                    params = [p for p in inspect.signature(fn).parameters if p != call_param]
                    kwargs[params[0]] = args
                else:
                    kwargs.update({k: getattr(args, k) for k in type(args).model_fields})
                if call_param:
                    kwargs[call_param] = call
                return _to_result(await fn(**kwargs))

            self._activities.append(run)
            return fn
        return wrap

    def declarations(self) -> list[ServiceTool]:
        return list(self._tools)

    def activities(self) -> list[Callable[..., Any]]:
        return list(self._activities)
