"""SessionRun: what the rooms of one session run share (the inbox, the turn, the tools).

Invariant: the workflow holds small state (sequence pointers, counters, the input queue,
the current mind / memo / now for queries); the conversation lives in PostgreSQL and every
activity loads what it needs by reference. This object is that small state for one run:
the durable part (`SessionState`, carried over continue-as-new), the event stream, and what
status says (`phase`, `last_error`), plus the writes every room makes the same way (a
notice in the record, the summary in the memo). A notice that cannot be recorded is said in
`last_error` and never fails the step that wrote it; its seq settles either way, so no
window waits on it. Background work (fences, the transcript) is held in `tasks` until done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.session import RecordInput, SessionActivities
    from schemas.agent import session_tools
    from schemas.budget import BudgetScope
    from schemas.input_size import InputLimits, input_limits
    from schemas.messages import MessageType
    from schemas.session import SessionPhase, SessionState, SessionStatus
    from schemas.text import make_storable
    from workflows.events import SessionEvents
    from workflows.failures import reason
    from workflows.options import RECORD_NOTICE

__all__ = ["SessionRun"]


class SessionRun:
    """The session's small state in this run; built once, in the workflow's `__init__`."""

    def __init__(self, state: SessionState, events: SessionEvents) -> None:
        self.state = state
        self.events = events
        self.window = state.config.window()
        self.phase = SessionPhase.STOPPED if state.stopped_reason else SessionPhase.IDLE
        self.last_error: str | None = None
        self.continuing = False  # continue-as-new has begun: handlers stop waiting
        self.rewinding = False  # a rewind runs: no turn starts until it is done
        self.tasks: set[asyncio.Task[None]] = set()  # fences and transcripts, until done

    def hold(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background, held until done."""
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def input_limits(self) -> InputLimits:
        """How large one input may be in this session's context (schemas.input_size)."""
        return input_limits(self.state.config.max_message_chars, self.window.hard_limit)

    def settled_phase(self) -> SessionPhase:
        """The phase between turns: ended, stopped, or idle."""
        state = self.state
        return SessionPhase.ENDED if state.ended else (
            SessionPhase.STOPPED if state.stopped_reason else SessionPhase.IDLE)

    def should_continue_as_new(self) -> bool:  # the loop's and the approval wait's rule
        limit = self.state.config.continue_as_new_after_events
        info = workflow.info()
        return info.is_continue_as_new_suggested() or (
            limit > 0 and info.get_current_history_length() >= limit)

    def status(self) -> SessionStatus:
        """What the status query answers."""
        state = self.state
        agent, delegated = state.config.agent, state.config.delegated
        budget = agent.budget if agent else None
        return SessionStatus(
            session_id=state.session_id, phase=self.phase, turn=state.turn,
            context_tokens=state.context_tokens, context_window=state.config.context_window,
            checkpoint_threshold=self.window.threshold,
            checkpoint_count=state.checkpoint_count, pending_inputs=len(state.pending),
            window_start_seq=state.window_start_seq, last_seq=state.recorded_upto,
            model=state.config.model, stopped_reason=state.stopped_reason,
            last_error=self.last_error, pending_approvals=list(state.approvals),
            ended=state.ended, agent_instructions_chars=len(agent.instructions) if agent else 0,
            tools=[t["name"] for t in session_tools([], agent, state.mcp_tools)]
            if agent else [],
            spent=state.budget.spent, turn_spent=state.budget.turn_spent,
            budget_request=state.budget.request,
            session_limits=state.budget.limits(budget, BudgetScope.SESSION),
            turn_limits=state.budget.limits(budget, BudgetScope.TURN),
            wakeups=list(state.wakeups), children=list(state.children),
            parent_session=delegated.parent_session if delegated else None,
            prompt_cache_ttl=state.cache_ttl_now(),
            prompt_cache_setting=state.config.prompt_cache_ttl,
            answered_by=state.answered_by,
        )

    def publish_summary(self) -> None:
        """What `keel list` shows, in the workflow's memo (Temporal visibility)."""
        state = self.state
        window = max(state.config.context_window, 1)
        summary: dict[str, Any] = {
            "phase": self.phase.value, "turn": state.turn,
            "context_percent": round(100 * state.context_tokens / window, 1),
            "checkpoints": state.checkpoint_count,
            "last_activity": workflow.now().isoformat(timespec="seconds"),
        }
        if state.config.delegated is not None:  # a child: `keel list` shows the tree
            summary["parent"] = state.config.delegated.parent_session
        workflow.upsert_memo({"keel": summary})

    async def record_notice(self, text: str) -> None:
        """A notice in Keel's voice at the next seq."""
        state = self.state
        seq = state.allocate_seq()
        try:
            await workflow.execute_activity_method(
                SessionActivities.record_input,
                RecordInput(session_id=state.session_id, seq=seq, input_id=f"notice-{seq}",
                            type=MessageType.NOTICE, text=make_storable(text)[0],
                            turn=state.turn, user_name=state.config.user_name),
                **RECORD_NOTICE)
        except ActivityError as err:
            self.last_error = f"{text} (and that notice could not be recorded: {reason(err)})"
            workflow.logger.error("notice not recorded: %s", err)
        state.settle_seq(seq)
