"""How the session workflow reads what any client sends it: its input, each Update's
argument. Every entry point takes its payload raw and decodes it here, so bad input from
any client (another SDK, the Temporal CLI, plain JSON) ends in a known state instead of a
workflow task retried without end:

- a start whose input does not decode, names an agent spec Keel refuses (an unknown
  field, a secret, a bad schema), asks for a window that leaves it no room, or comes under
  an id that cannot name a session, fails at once with the reason (`StartInput.refused`);
- an Update whose argument does not decode is refused by its validator with
  `Rejection.MALFORMED_INPUT`, naming the field and never quoting the value;
- a signal's payload is decoded the same way by the inbox, which records a notice.

Invariants:
- Decoding is the data converter's own (`model_validate_json` of a `json/plain` payload,
  as `temporalio.contrib.pydantic` does), so what decoded before decodes to the same value.
- Data this workflow wrote or accepted before (a carried-over state, an Update replayed from
  history) is decoded leniently (`schemas.strict.STORED`: unknown spec fields dropped, as
  before); only a new input meets the strict rules. A fresh start that the lenient reading
  would have taken is refused only under `workflow.patched(REFUSE_PATCH)`, so a history
  that took such an input replays as it ran.
- Pure apart from `workflow.info()` and `workflow.patched`: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from schemas.agent import BUILTIN_TOOL_NAMES, AgentSpecError, check_spec
    from schemas.input_size import config_fit_problem
    from schemas.session import (
        ARGUMENTS_ENCODING,
        Rejection,
        SessionConfig,
        SessionInput,
        config_bounds_problem,
        session_id_problem,
    )
    from schemas.strict import STORED
    from workflows.failures import decode_problem

__all__ = ["REFUSE_PATCH", "StartInput", "arg", "malformed", "payload_json", "start_input",
           "valid_arg"]

M = TypeVar("M", bound=BaseModel)

# A fresh start the lenient reading would take but the strict one refuses (an unknown spec
# field, a spec check_spec refuses): refused from this patch on.
REFUSE_PATCH = "refuse-bad-start-input"
# A fresh start whose agent leaves no room in its window (schemas.input_size): refused from
# this patch on (before, its session stopped on the first message).
FIT_PATCH = "refuse-agent-over-window"
# A fresh start whose config a session cannot work with (schemas.session.
# config_bounds_problem), or whose window leaves Keel's own prompt no room or a full reply
# leaves a request nothing (schemas.input_size): refused from this patch on.
CONFIG_PATCH = "refuse-unworkable-config"
# A fresh start under an id that cannot name a session (schemas.session.session_id_problem:
# a folder it cannot be, Keel's own `_shared`): refused from this patch on.
SESSION_ID_PATCH = "refuse-bad-session-id"


def _config_refused(config: SessionConfig, placeholder: SessionInput) -> StartInput | None:
    """A fresh start refused for its config, from the patch that refuses it: an agent that
    leaves no room (as a spec is refused), values a session cannot work with
    (schemas.session.config_bounds_problem), a window that leaves Keel's own prompt no room
    (schemas.input_size); None: it may start."""
    too_big = config_fit_problem(config)
    if too_big is not None and config.agent is not None:  # checked first, as before
        if workflow.patched(FIT_PATCH) and workflow.patched(REFUSE_PATCH):
            return StartInput(placeholder, f"{AgentSpecError([too_big])}; nothing was written",
                              type=Rejection.AGENT_SPEC_REFUSED)
        return None
    problem = config_bounds_problem(config) or too_big
    if problem is None or not workflow.patched(CONFIG_PATCH):
        return None
    return StartInput(placeholder, f"the session's config is refused: {problem}; nothing "
                                   "was written")


def payload_json(raw: RawValue | None, no_payload: RawValue) -> bytes:
    """The JSON bytes of one argument, or ValueError saying why there are none."""
    if raw is None or raw is no_payload:
        raise ValueError("expected one argument")
    if not isinstance(raw, RawValue):
        raise ValueError("more than one argument")
    if raw.payload.metadata.get("encoding", b"") == ARGUMENTS_ENCODING:
        # workers.entry_guard: the run had this many arguments
        raise ValueError(f"expected one argument, got "
                         f"{raw.payload.data.decode(errors='replace')}")
    encoding = raw.payload.metadata.get("encoding", b"").decode(errors="replace")
    if encoding != "json/plain":
        raise ValueError(f"the payload's encoding is {encoding or 'missing'}, not json/plain")
    return raw.payload.data


def malformed(what: str, err: Exception) -> ApplicationError:
    """The refusal of an input that does not decode, naming fields, never the value."""
    return ApplicationError(f"{what} is malformed: {decode_problem(err)}",
                            type=Rejection.MALFORMED_INPUT, non_retryable=True)


# An Update or a run sent no argument gets this (the SDK passes a payload as is only to a
# parameter typed exactly RawValue, so the default must be one).
NO_PAYLOAD = RawValue(Payload())


def valid_arg(model: type[M], raw: RawValue | None, no_payload: RawValue, what: str) -> M:
    """An Update's argument for its validator: strict, or refused (MALFORMED_INPUT)."""
    try:
        return model.model_validate_json(payload_json(raw, no_payload))
    except (ValidationError, ValueError) as err:
        raise malformed(what, err) from None


def decoded_or_none(model: type[M], raw: RawValue | None) -> M | None:
    """A small workflow's start (an upload's, a download's) as read, or None when it does
    not decode (another client's): that run then ends at once, failing no task."""
    try:
        return model.model_validate_json(payload_json(raw, NO_PAYLOAD))
    except (ValidationError, ValueError):
        return None


def arg(model: type[M], raw: RawValue | None, no_payload: RawValue) -> M:
    """An Update's argument for its handler, once its validator took it (or replayed from
    history, where validators do not run): read as it was accepted."""
    return model.model_validate_json(payload_json(raw, no_payload), context=STORED)


@dataclass(frozen=True)
class StartInput:
    """A run's input as read: `refused` says why the run must fail (nothing is written)."""

    value: SessionInput
    refused: str | None = None
    type: str = Rejection.MALFORMED_INPUT


def _lenient(data: bytes) -> SessionInput | Exception:
    try:
        return SessionInput.model_validate_json(data, context=STORED)
    except ValidationError as err:
        return err


def start_input(raw: RawValue | None, no_payload: RawValue) -> StartInput:
    """The run's input. A run carried over continue-as-new reads Keel's own state
    leniently; a fresh start is read strictly and its agent spec checked (as a client's
    start is), and refused, with every reason, when either fails."""
    workflow_id = workflow.info().workflow_id
    placeholder = SessionInput(session_id=workflow_id)
    try:
        data = payload_json(raw, no_payload)
    except ValueError as err:
        return StartInput(placeholder, f"the session's input is malformed: {err}")
    lenient = _lenient(data)
    if isinstance(lenient, Exception):  # never took a step before: refused as it is
        return StartInput(placeholder, f"the session's input is malformed: "
                                       f"{decode_problem(lenient)}; nothing was written")
    if workflow.info().continued_run_id is not None:
        return StartInput(lenient)
    if (bad_id := session_id_problem(workflow_id)) and workflow.patched(SESSION_ID_PATCH):
        return StartInput(placeholder, f"{bad_id}; nothing was written")
    problem: str | None = None
    try:
        strict = SessionInput.model_validate_json(data)
    except ValidationError as err:
        problem = f"the session's input is refused: {decode_problem(err)}"
    else:
        config = strict.state.config if strict.state else strict.config
        try:
            if config.agent is not None:
                check_spec(config.agent, BUILTIN_TOOL_NAMES)
        except AgentSpecError as err:
            problem = str(err)
        else:
            if refused := _config_refused(config, placeholder):
                return refused
    if problem and workflow.patched(REFUSE_PATCH):
        return StartInput(placeholder, f"{problem}; nothing was written",
                          type=Rejection.AGENT_SPEC_REFUSED)
    return StartInput(lenient)

