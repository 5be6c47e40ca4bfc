"""A session's budget, its stop button and its wakeups, for `keel.handle.SessionHandle`.

Invariant: thin calls of the session's Updates and queries by their names in
`schemas.session` (`ANSWER_BUDGET`, `INTERRUPT`, `WAKEUPS`, `CANCEL_WAKEUP`); every
refusal is one of Keel's exceptions (keel._errors), and nothing here holds session logic.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from temporalio.client import WorkflowHandle

from keel._errors import MessageRejectedError, refusals
from schemas.budget import BudgetAnswer, BudgetLimits, BudgetRequest, as_much_again
from schemas.initiative import Wakeup
from schemas.session import (
    MAX_INPUT_ID_CHARS,
    MAX_NOTE_CHARS,
    CancelWakeup,
    Handler,
    SessionStatus,
    text_limits,
)
from schemas.strict import first_problem

__all__ = ["SessionControls"]


class SessionControls:
    """Mixed into `SessionHandle`: answering a reached budget, interrupting a turn, the
    wakeups the agent scheduled."""

    handle: WorkflowHandle[Any, SessionStatus]

    async def raise_budget(self, usd: float | None = None, *, input_tokens: int | None = None,
                           cached_tokens: int | None = None,
                           output_tokens: int | None = None, request_id: str | None = None,
                           by: str = "user", note: str = "") -> SessionStatus:
        """Raise the reached budget by these amounts; the paused turn goes on (and pauses
        again if that is not enough). `NoBudgetRequestError` when none is pending."""
        try:
            raise_by = BudgetLimits(usd=usd, input_tokens=input_tokens,
                                    cached_tokens=cached_tokens, output_tokens=output_tokens)
        except ValidationError as err:
            raise MessageRejectedError(f"the budget answer: {first_problem(err)}") from None
        return await self._answer(BudgetAnswer(request_id=request_id, raise_by=raise_by,
                                               by=by, note=note))

    async def raise_as_much_again(self, request: BudgetRequest, *, by: str = "user",
                                  note: str = "") -> SessionStatus:
        """Raise each limit `request` reached by as much again (schemas.budget's
        `as_much_again`), bound to it: a request made since is not answered by this."""
        raise_by, _ = as_much_again(request)
        return await self.raise_budget(**raise_by.model_dump(), request_id=request.request_id,
                                       by=by, note=note)

    async def refuse_budget(self, *, request_id: str | None = None, by: str = "user",
                            note: str = "") -> SessionStatus:
        """Refuse to raise it: the paused turn ends, saying so."""
        return await self._answer(BudgetAnswer(request_id=request_id, refuse=True, by=by,
                                               note=note))

    async def _answer(self, answer: BudgetAnswer) -> SessionStatus:
        if problem := answer.problem() or text_limits(
                note=(answer.note, MAX_NOTE_CHARS), by=(answer.by, MAX_INPUT_ID_CHARS)):
            raise MessageRejectedError(f"the budget answer: {problem}")
        async with refusals(self.handle):
            status: SessionStatus = await self.handle.execute_update(
                Handler.ANSWER_BUDGET, answer, result_type=SessionStatus)
        return status

    async def interrupt(self) -> SessionStatus:
        """Stop the running turn now (its model call cancelled, what streamed kept);
        nothing when the session is idle."""
        async with refusals(self.handle):
            status: SessionStatus = await self.handle.execute_update(
                Handler.INTERRUPT, result_type=SessionStatus)
        return status

    async def wakeups(self) -> list[Wakeup]:
        """The wakeups the agent has scheduled now (schemas.initiative)."""
        async with refusals(self.handle):
            found: list[Wakeup] = await self.handle.query(Handler.WAKEUPS,
                                                          result_type=list[Wakeup])
        return found

    async def cancel_wakeup(self, wakeup_id: str) -> list[Wakeup]:
        """Cancel one wakeup (its schedule too); `NotPendingError` when there is no such
        wakeup. Returns the wakeups left."""
        async with refusals(self.handle):
            left: list[Wakeup] = await self.handle.execute_update(
                Handler.CANCEL_WAKEUP, CancelWakeup(wakeup_id=wakeup_id),
                result_type=list[Wakeup])
        return left
