"""Carry: what the workflow's payloads carry of a session's large texts, and how the rest
is read back from PostgreSQL.

Invariant: a reply travels through the workflow as its first REPLY_INLINE_CHARS only (the
model call's result, the turn's outcome); a caller reads the rest by its seq, a part at a
time (`read_reply`, the READ_REPLY Update; keel.client does it for its callers). The
continue-as-new input (the next run's first workflow task) stays small
whatever the window and however long the session. The checkpoint's mind, memo and now stay
in PostgreSQL and the new run reads them by the checkpoint id before its first turn
(`restore_texts`); the carried outcomes' replies are cut, the newest kept longest, each cut
one marked so (`reply_cut`: a caller reads the rest by READ_REPLY); the event stream carries at most
CARRIED_EVENT_BYTES of its newest events. Until its texts are back a run answers the mind,
memo and now queries with TEXTS_LOADING (keel.client asks again), never with an empty text.
Histories from before `workflow.patched(SMALL_CARRY)` carry as they did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import NoReturn

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityConfig

with workflow.unsafe.imports_passed_through():
    from activities.checkpoint import CheckpointActivities
    from activities.session import ReadReplyInput, SessionActivities
    from schemas.agent import ApprovalDecision
    from schemas.session import (
        ReadReply,
        Rejection,
        ReplyPart,
        SessionInput,
        SessionState,
        TurnOutcome,
    )
    from workflows.failures import reason
    from workflows.inbox import Inbox
    from workflows.options import DB_RETRY, FILE_CALL
    from workflows.run import SessionRun

__all__ = ["KEPT_OUTCOMES", "SMALL_CARRY", "carried_outcome", "carried_outcomes",
           "carried_state", "continue_as_new", "query_text", "read_reply", "restore_texts"]

SMALL_CARRY = "small-continue-as-new"
KEPT_OUTCOMES = 16  # carried over continue-as-new
CARRIED_REPLY_CHARS = 8_000  # of each carried outcome's reply (before SMALL_CARRY)
NEWEST_REPLY_CHARS = 4_000  # of the newest one's; the record has it whole (READ_REPLY)
OLDER_REPLY_CHARS = 300  # of each older one's (a caller's retry of an old input is rare)
CARRIED_EVENT_BYTES = 20_000  # of the event stream's newest events
# The texts are read once per run; a database that does not answer in two minutes leaves
# them for the next turn to read (status says why).
RESTORE_TEXTS = ActivityConfig(start_to_close_timeout=timedelta(seconds=30),
                               schedule_to_close_timeout=timedelta(minutes=2),
                               retry_policy=DB_RETRY)
TEXTS_LOADING = (f"{Rejection.TEXTS_LOADING}: this run is reading the checkpoint's mind, memo"
                 " and now back from the record (it continued as new a moment ago): ask again")


def carried_outcome(outcome: TurnOutcome, limit: int = CARRIED_REPLY_CHARS, *,
                    by_reference: bool = False) -> TurnOutcome:
    """An outcome as continue-as-new carries it: its reply cut to `limit`, marked cut (the
    client reads the rest, READ_REPLY) when `by_reference`, else with a note saying where
    the record holds all of it."""
    if len(outcome.reply_text) <= limit:
        return outcome
    text = outcome.reply_text[:limit]
    if by_reference and outcome.reply_seq is not None:
        return outcome.model_copy(update={
            "reply_text": text, "reply_cut": True,
            "reply_chars": max(outcome.reply_chars, len(outcome.reply_text))})
    note = f"\n[cut: the whole reply is message #{outcome.reply_seq} of the record]"
    return outcome.model_copy(update={"reply_text": text + note})


def carried_outcomes(outcomes: Iterable[TurnOutcome], *, bounded: bool,
                     small: bool) -> list[TurnOutcome]:
    """The last KEPT_OUTCOMES distinct outcomes, oldest first: each reply cut to
    CARRIED_REPLY_CHARS when `bounded`; when `small`, the newest to NEWEST_REPLY_CHARS and
    the others to OLDER_REPLY_CHARS."""
    distinct = {id(o): o for o in outcomes}.values()
    kept = sorted(distinct, key=lambda o: o.turn)[-KEPT_OUTCOMES:]
    if small:
        return [carried_outcome(o, NEWEST_REPLY_CHARS if i == len(kept) - 1
                                else OLDER_REPLY_CHARS, by_reference=True)
                for i, o in enumerate(kept)]
    return [carried_outcome(o) for o in kept] if bounded else kept


def carried_state(state: SessionState, *, small: bool) -> SessionState:
    """The state the next run starts from: without the checkpoint's texts when `small`
    and there is a checkpoint to read them from."""
    if not small or state.checkpoint_id is None:
        return state
    return state.model_copy(update={"mind_text": "", "memo_text": "", "now_text": "",
                                    "texts_in_store": True})


async def continue_as_new(run: SessionRun, inbox: Inbox,
                          decisions: dict[str, ApprovalDecision],
                          outcomes: Iterable[TurnOutcome],
                          all_finished: Callable[[], bool]) -> NoReturn:
    """Continue as new once every handler, fence and transcript has finished: what the new
    run needs, small (the module's invariant)."""
    state = run.state
    await inbox.record_unrecorded()  # never carried: the new run has no caller
    run.continuing = True
    # A reader's poll is an update handler: released first, or it would wait forever.
    run.events.detach()
    await workflow.wait_condition(all_finished)
    carried = state.turn_in_progress
    if carried is not None:  # a decision that came in meanwhile goes with the turn
        left = {c.id for c in carried.reply.tool_calls[carried.next_call:]}
        carried.decisions = [d for d in decisions.values() if d.call_id in left]
    state.run_count += 1
    # A carried outcome answers a caller's retry; on a large window its reply can be a
    # hundred kilobytes, and sixteen of them pass the payload limit.
    bounded = workflow.patched("carried-outcomes-bounded")
    small = workflow.patched(SMALL_CARRY)
    state.recent_outcomes = carried_outcomes(outcomes, bounded=bounded, small=small)
    workflow.continue_as_new(SessionInput(
        session_id=state.session_id, config=state.config,
        state=carried_state(state, small=small),
        events=run.events.carry(CARRIED_EVENT_BYTES if small else None)))


async def restore_texts(run: SessionRun) -> None:
    """Read the checkpoint's mind, memo and now back into the state; on failure, say so in
    status and leave them for the next call."""
    state = run.state
    if not state.texts_in_store or state.checkpoint_id is None:
        state.texts_in_store = False
        return
    try:
        stored = await workflow.execute_activity_method(
            CheckpointActivities.checkpoint_texts, state.checkpoint_id, **RESTORE_TEXTS)
    except ActivityError as err:
        run.last_error = f"the checkpoint's mind, memo and now were not read back: {reason(err)}"
        return
    if state.texts_in_store:  # a checkpoint adopted meanwhile brought its own
        state.mind_text, state.memo_text = stored.mind_text, stored.memo_text
        state.now_text = stored.now_text
        state.texts_in_store = False


def query_text(state: SessionState, text: str) -> str:
    """A mind / memo / now query's answer: the text, or TEXTS_LOADING while it is away."""
    if state.texts_in_store:
        raise ApplicationError(TEXTS_LOADING, type=Rejection.TEXTS_LOADING)
    return text


async def read_reply(state: SessionState, data: ReadReply) -> ReplyPart:
    """A part of reply `data.seq` from the record; what could not be read refuses the
    Update with its reason."""
    try:
        part: ReplyPart = await workflow.execute_activity_method(
            SessionActivities.read_reply,
            ReadReplyInput(session_id=state.session_id, seq=data.seq, start=data.start),
            **FILE_CALL)
    except ActivityError as err:
        raise ApplicationError(reason(err), type=Rejection.NO_SUCH_INPUT,
                               non_retryable=True) from None
    return part
