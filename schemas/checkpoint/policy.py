"""How a session makes room for its next request: one ladder, every step and its rule.

When the next request would pass the threshold, Keel climbs this ladder, one step at a
time, until the request fits (the workflow walks it; the model-call activity measures):

    step                  what it does                               when
    PREPASS               shrink old tool outputs, no model           past the threshold
    CHECKPOINT            a checkpoint over the conversation          still past it, and allowed
    CHECKPOINT_EARLIER    a checkpoint over the earlier part only     the checkpoint turn itself
                                                                      would not fit the window
    SEND                  send the request as it is                   it fits under the hard limit
                                                                      (a failed checkpoint
                                                                      changes nothing)
    MOVE_EARLIEST_HALF    move about the earliest half out, no model  it cannot be sent and no
                                                                      checkpoint made room
    CUT_NEWEST_OUTPUT     cut the newest tool output to fit           nothing more can move out
    STOP                  "too long, start a new session"             nothing helped

A checkpoint is allowed while this agent turn has had fewer than two failed (or too
small) checkpoints, and while the recent ones did not each free under 5% of the window.
Every number of the trigger lives here; the budgets of what a checkpoint carries live in
`schemas.checkpoint.budgets`.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel

# Codex starts condensing at 90% of the window; we never let the context go past it.
THRESHOLD_FRACTION_NUM, THRESHOLD_FRACTION_DEN = 9, 10
# Claude Code keeps a 20k reply reserve and a 13k safety margin (about 83% of 200k). The
# reply reserve never takes more than a quarter of a small window, or nothing would be left.
REPLY_RESERVE_CAP = 20_000
SAFETY_MARGIN_CAP = 13_000

# The reference's "run" is one agent run: here one agent turn (the inputs it answers, its
# model calls and tool calls). After this many failed or too-small checkpoints in one turn,
# only the move makes room until the next turn.
MAX_FAILED_CHECKPOINTS_PER_TURN = 2
# Anti-thrash: when each of the last THRASH_LOOKBACK condensations freed less than this
# share of the window, another would only loop (a peer's session condensed 211 times).
THRASH_MIN_FRACTION = 0.05
THRASH_LOOKBACK = 2
# How many recent savings the session remembers for the anti-thrash rule.
SAVINGS_KEPT = 3
# A checkpoint over the earlier part condenses up to about this share of the live window.
EARLIER_PART_PORTION = 0.5


class RoomStep(StrEnum):
    PREPASS = "prepass"
    CHECKPOINT = "checkpoint"
    CHECKPOINT_EARLIER = "checkpoint_earlier"
    SEND = "send"
    MOVE_EARLIEST_HALF = "move_earliest_half"
    CUT_NEWEST_OUTPUT = "cut_newest_output"
    STOP = "stop"


class Fit(StrEnum):
    """Where a request's estimated size stands."""

    FITS = "fits"  # at or under the threshold
    OVER_THRESHOLD = "over_threshold"  # past the threshold, still under the hard limit
    OVER_LIMIT = "over_limit"  # cannot be sent at all


def _effective_window(context_window: int, price_step_tokens: int | None) -> int:
    # Past a price step every token costs more, so the price step acts as the window.
    if price_step_tokens is not None and price_step_tokens > 0:
        return max(1, min(context_window, price_step_tokens))
    return max(1, context_window)


def effective_window(context_window: int, price_step_tokens: int | None = None) -> int:
    """The window a session's budgets scale with: the price step when there is one."""
    return _effective_window(context_window, price_step_tokens)


def default_safety_margin(context_window: int, price_step_tokens: int | None = None) -> int:
    """Claude Code's 13k margin, or a twentieth of a smaller (effective) window."""
    return min(SAFETY_MARGIN_CAP, _effective_window(context_window, price_step_tokens) // 20)


def reply_reserve(context_window: int, max_output_tokens: int) -> int:
    return max(0, min(max_output_tokens, REPLY_RESERVE_CAP, context_window // 4))


def checkpoint_threshold(
    context_window: int,
    max_output_tokens: int,
    price_step_tokens: int | None = None,
    safety_margin: int | None = None,
) -> int:
    """The token count the next request must not pass: past it, the ladder starts.

    The smallest of: 90% of the window (Codex's trigger); the window less the room kept
    for the reply and a safety margin (Claude Code's reserve and margin, which bind on small
    windows with large outputs); and the price step less the margin, when the price per
    token rises above a context size.
    """
    margin = (
        default_safety_margin(context_window, price_step_tokens)
        if safety_margin is None
        else max(0, safety_margin)
    )
    candidates = [
        context_window * THRESHOLD_FRACTION_NUM // THRESHOLD_FRACTION_DEN,
        context_window - reply_reserve(context_window, max_output_tokens) - margin,
    ]
    if price_step_tokens is not None and price_step_tokens > 0:
        candidates.append(price_step_tokens - margin)
    return max(1, min(candidates))


class ModelWindow(BaseModel):
    """A model's sizes, as a session is configured with them."""

    context_window: int
    max_output_tokens: int
    price_step_tokens: int | None = None

    @property
    def threshold(self) -> int:
        return checkpoint_threshold(self.context_window, self.max_output_tokens,
                                    self.price_step_tokens)

    @property
    def hard_limit(self) -> int:
        """Above this a request cannot be sent at all: the window less a full reply."""
        return self.context_window - self.max_output_tokens


def fit(estimate: int, window: ModelWindow) -> Fit:
    """Where a request of `estimate` tokens stands against the threshold and the limit."""
    if estimate > window.hard_limit:
        return Fit.OVER_LIMIT
    if estimate > window.threshold:
        return Fit.OVER_THRESHOLD
    return Fit.FITS


def sendable(size: Fit, *, room_asked: bool) -> bool:
    """Whether the activity sends the request: always when it fits; past the threshold only
    once the session has already walked the ladder for it (`room_asked`)."""
    return size is Fit.FITS or (size is Fit.OVER_THRESHOLD and room_asked)


def thrashing(recent_savings: list[int], window: int,
              min_fraction: float = THRASH_MIN_FRACTION,
              lookback: int = THRASH_LOOKBACK) -> bool:
    """True when each of the last `lookback` condensations freed under ~5% of the window."""
    if window <= 0 or len(recent_savings) < lookback:
        return False
    return all(s < min_fraction * window for s in recent_savings[-lookback:])


def checkpoint_allowed(failures_this_turn: int, recent_savings: list[int],
                       window: int) -> bool:
    """A model checkpoint may run: under two failures this turn, and not thrashing."""
    return (failures_this_turn < MAX_FAILED_CHECKPOINTS_PER_TURN
            and not thrashing(recent_savings, window))


def remember_saving(recent_savings: list[int], saved: int) -> list[int]:
    return [*recent_savings[-(SAVINGS_KEPT - 1):], saved]


def made_enough_room(tokens_after: int, window: ModelWindow) -> bool:
    """A stored checkpoint that leaves the context past the threshold counts as failed."""
    return tokens_after <= window.threshold


class RoomTried(BaseModel):
    """What making room for one request has done so far."""

    checkpoint: bool = False
    move_failed: bool = False
    output_cut: bool = False
    send_as_is: bool = False  # past the threshold with nothing more to try: it still fits

    @property
    def asked(self) -> bool:
        """The ladder has been walked for this request: past the threshold it is sent."""
        return self.checkpoint or self.move_failed or self.output_cut or self.send_as_is


def next_step(size: Fit, tried: RoomTried, *, checkpoint_allowed: bool) -> RoomStep:
    """The next rung of the ladder for a request of this size (the pre-pass has run)."""
    if size is Fit.FITS:
        return RoomStep.SEND
    if checkpoint_allowed and not tried.checkpoint:
        return RoomStep.CHECKPOINT
    if size is Fit.OVER_THRESHOLD:
        return RoomStep.SEND  # a failed checkpoint changes nothing: a request that fits goes
    if not tried.move_failed:
        return RoomStep.MOVE_EARLIEST_HALF  # again and again while each move frees room
    if not tried.output_cut:
        return RoomStep.CUT_NEWEST_OUTPUT
    return RoomStep.STOP


def checkpoint_portion(turn_tokens: int, context_window: int, portion: float) -> float:
    """The share of the live window a checkpoint turn condenses: all of it when the turn
    (conversation, instruction, files, reply room) fits the window, else the earlier part."""
    if portion > EARLIER_PART_PORTION and turn_tokens > context_window:
        return EARLIER_PART_PORTION
    return portion


def portion_after_refusal(portion: float) -> float | None:
    """After the API refused a checkpoint turn as too large: try the earlier part once."""
    return EARLIER_PART_PORTION if portion > EARLIER_PART_PORTION else None
