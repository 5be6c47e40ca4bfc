"""The session's budget in the workflow: spend charged after each model call (a turn's, and
a checkpoint's rounds and memory flush), and the pause before a call when a budget is
reached (the rules are pure, in `schemas.budget`).

Invariants:
- A budget is checked before a model call, never during one: a reply is recorded whole, a
  tool call already made gets its result, and a reached budget pauses the turn durably at
  the next call, as an approval does. Every model call the session makes is charged: a
  checkpoint's rounds, repair and memory flush when it ends (stored or not), and a budget
  they reached is checked before the call they made room for. The pause is
  `BudgetState.request` in the state; a pause that outlasts the run's history continues as
  new with the turn (workflows.turn carries it), and the new run waits again at the same
  call.
- A limit the spend comes near (the spec's `warn_at` of it, 80% by default) is said once
  after the call that came near it: a `budget_near` event and a notice in the record; a
  raise that moves the limit arms it again.
- The request is said in the record (a notice) and in `status` (`budget_request`, the
  phase `awaiting_budget`); a person answers it (`answer`): a raise and the turn goes on
  (checked again: a raise too small pauses again), a refusal and the turn ends saying so.
  A session ended while paused, or a turn interrupted while paused (workflows.interrupt),
  ends the turn saying so (the next turn asks again). Nothing is refused silently.
- With no budget in the spec and none raised, nothing here issues a command: histories
  recorded before budgets replay unchanged (the gate's patch marker is written only when a
  budget applies).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import Enum

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from schemas.budget import (
        BudgetAnswer,
        BudgetLimits,
        BudgetRequest,
        BudgetScope,
        BudgetSpec,
        Spend,
        answered_notice,
        budget_notice,
        raise_problem,
        warning_notice,
    )
    from schemas.events import BudgetAnswered, BudgetNear, BudgetReached
    from schemas.session import SessionPhase
    from workflows.run import SessionRun

__all__ = ["BUDGET_REFUSED", "ENDED_WHILE_PAUSED", "STOPPED_WHILE_PAUSED", "BudgetGate",
           "Gate"]

BUDGET_PATCH = "budget-gate"
CHECKPOINT_SPEND_PATCH = "checkpoint-spend-gate"  # a checkpoint's calls are charged too
BUDGET_WARNING_PATCH = "budget-warning"  # a limit's warn_at share is said
BUDGET_REFUSED = "The budget was reached and a raise was refused: the turn ended there."
ENDED_WHILE_PAUSED = "The session was ended while the turn waited on its budget."
STOPPED_WHILE_PAUSED = ("The turn was interrupted while it waited on its budget; the next "
                        "turn asks again.")


class Gate(Enum):
    """What the turn does at a model call: go on, end (refused, ended), or continue as new
    with the turn (the pause outlasted the run's history)."""

    GO = "go"
    END = "end"
    CONTINUE_AS_NEW = "continue_as_new"


class BudgetGate:
    """Charges the session's model calls (its turns', its checkpoints') and pauses a turn
    at a reached budget."""

    def __init__(self, run: SessionRun) -> None:
        self.run = run
        self.ended_reason: str | None = None  # why the last gate said END
        self.stopping: Callable[[], bool] = lambda: False  # the turn was asked to stop

    @property
    def spec(self) -> BudgetSpec | None:
        agent = self.run.state.config.agent
        return agent.budget if agent else None

    def start_turn(self) -> None:
        state = self.run.state
        state.budget.start_turn(state.turn)

    async def charge(self, spend: Spend, *, in_turn: bool = True) -> None:
        """A model call's usage and cost (a turn's call: `spend_of` its reply; a
        checkpoint's rounds and flush: its outcome's), on the session's and the turn's
        (`in_turn`); then each limit it came near is said, once, on the stream and in the
        record."""
        budget = self.run.state.budget
        budget.charge(spend, in_turn=in_turn)
        warnings = budget.warnings(self.spec)
        if not warnings or not workflow.patched(BUDGET_WARNING_PATCH):
            return
        for w in warnings:
            self.run.events.emit(BudgetNear, turn=self.run.state.turn, scope=w.scope.value,
                                 limit=w.limit, said=w.said, share=round(w.share, 4))
            await self.run.record_notice(warning_notice(w))

    def reached_by_room(self) -> bool:
        """Room was made for a call that passed the gate: its checkpoint's model calls were
        charged, and a budget they reached pauses the turn before the call, as any call's
        spend would. The patch marker is written only when one is reached."""
        return self.run.state.budget.check(self.spec) is not None \
            and workflow.patched(CHECKPOINT_SPEND_PATCH)

    async def gate(self, before_pause: Callable[[], Awaitable[None]] | None = None) -> Gate:
        """Before a model call: GO, or the pause until a person answers. `before_pause` runs
        first when the turn pauses (the turn records the messages its call would have)."""
        state, budget = self.run.state, self.run.state.budget
        if budget.request is None and budget.check(self.spec) is None:
            return Gate.GO
        if not workflow.patched(BUDGET_PATCH):  # pragma: no cover (old histories: no budget)
            return Gate.GO
        while True:
            request = budget.request
            if request is None:
                found = budget.check(self.spec)
                if found is None:
                    self._resumed()
                    return Gate.GO
                if before_pause is not None:
                    await before_pause()
                request = await self._ask(*found)  # it may be answered while said
            if self.run.phase is not SessionPhase.AWAITING_BUDGET:  # a pause carried over
                self.run.phase = SessionPhase.AWAITING_BUDGET
                self.run.publish_summary()

            def answered(r: BudgetRequest = request) -> bool:
                return state.budget.request is not r or state.ended or self.stopping() \
                    or self.run.should_continue_as_new()
            await workflow.wait_condition(answered)
            stopped = budget.request is request and self.stopping()
            if budget.request is request and not state.ended and not stopped:
                return Gate.CONTINUE_AS_NEW
            refused = budget.refused == request.request_id
            if state.ended or refused or stopped:
                budget.request = None
                self.ended_reason = BUDGET_REFUSED if refused else (
                    STOPPED_WHILE_PAUSED if stopped else ENDED_WHILE_PAUSED)
                self._resumed()
                return Gate.END

    async def _ask(self, scope: BudgetScope, reached: list[str]) -> BudgetRequest:
        state, budget = self.run.state, self.run.state.budget
        budget.requests_made += 1
        limits = budget.limits(self.spec, scope)
        assert limits is not None
        request = BudgetRequest(
            request_id=f"budget-{state.turn}-{budget.requests_made}", scope=scope,
            reached=reached, spent=budget.spent if scope is BudgetScope.SESSION
            else budget.turn_spent, limits=limits, turn=state.turn, since=workflow.now())
        budget.request = request
        self.run.phase = SessionPhase.AWAITING_BUDGET
        self.run.events.emit(BudgetReached, turn=state.turn, request_id=request.request_id,
                             scope=scope.value, reached="; ".join(reached),
                             spent_usd=request.spent.usd)
        self.run.publish_summary()
        await self.run.record_notice(budget_notice(request))
        return request

    def _resumed(self) -> None:
        self.run.phase = SessionPhase.RUNNING
        self.run.publish_summary()

    async def answer(self, answer: BudgetAnswer) -> BudgetRequest:
        """A person's answer (the validator checked it is for the pending request), said in
        the record."""
        budget = self.run.state.budget
        request = budget.request
        assert request is not None
        if answer.refuse:
            budget.refused = request.request_id
        else:
            assert answer.raise_by is not None
            budget.grant(request.scope, answer.raise_by)
        budget.request = None
        self.run.events.emit(BudgetAnswered, turn=request.turn, request_id=request.request_id,
                             raised=not answer.refuse, by=answer.by)
        await self.run.record_notice(answered_notice(request, answer))
        return request

    def raise_problem(self, raise_by: BudgetLimits) -> str | None:
        """Why a raise of the pending request cannot let its turn go on (schemas.budget)."""
        request = self.run.state.budget.request
        return raise_problem(request, raise_by) if request is not None else None

    def answer_problem(self, answer: BudgetAnswer) -> str | None:
        """Why `answer` cannot be taken, or None."""
        request = self.run.state.budget.request
        if request is None:
            return "no budget request is pending in this session"
        if answer.request_id is not None and answer.request_id != request.request_id:
            return (f"budget request {answer.request_id!r} is not pending (the pending one "
                    f"is {request.request_id!r})")
        return None
