"""How a session makes room for its next request: one ladder, every step and its rule.

When the next request would pass the threshold, Keel climbs this ladder, one step at a
time, until the request fits (the workflow walks it; the model-call activity measures):

    step                  what it does                               when
    PREPASS               shrink old tool outputs, no model           past the threshold
    CHECKPOINT            a checkpoint over the conversation          still past it, and allowed
    CHECKPOINT_EARLIER    a checkpoint over the largest earlier part  the checkpoint turn itself
                          that fits (the newest tool output alone     would not fit the window
                          left out first)
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

Invariant: the threshold keeps room for the checkpoint turn itself (its instruction, the
mind and memo files at their limits, its short reply), so a checkpoint started at the
threshold sees the conversation up to the newest step; seeing only an earlier part is the
exception (one tool output larger than the safety margin), and then the part is the
largest that fits, not a fixed half.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel

from schemas.checkpoint.scale import memo_limits, mind_section_limits

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
# After the API refused a checkpoint turn as too large: condense at most this share.
EARLIER_PART_PORTION = 0.5
# The checkpoint instruction's own words (measured ~870 tokens) with the headings around
# the two files; the files themselves are counted at their limits (mind, memo checklist).
CHECKPOINT_INSTRUCTION_ROOM = 1_000
# A checkpoint round writes edits and the now, not a full reply: it asks for at most this.
CHECKPOINT_REPLY_CAP = 4_096
# The one repair request: Keel's words and the problems it lists (a checklist changed line
# by line lists more; then the repair is skipped when it does not fit, and fallbacks hold).
REPAIR_REQUEST_ROOM = 400
# The final-round note and the headers of the rounds' messages.
ROUND_NOTES_ROOM = 100
# Below this reply room a round cannot write the now: the turn ends with what it wrote.
MIN_ROUND_REPLY = 512
# On a tiny window the instruction alone is a large share: the trigger keeps at most this
# share of the window for the turn, and the earlier-part path does the rest.
CHECKPOINT_TURN_MAX_SHARE_NUM, CHECKPOINT_TURN_MAX_SHARE_DEN = 3, 10
# What Keel's estimate may still be off by once the usage ratio is learned (a real model's
# tokenizer weighs code, prose and JSON differently): a fiftieth of the window.
ESTIMATE_MARGIN_DEN = 50
ESTIMATE_MARGIN_MIN = 64


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


def checkpoint_reply_room(context_window: int, max_output_tokens: int) -> int:
    """The reply room (max_tokens) of a checkpoint round: its edits and the now, never more
    than an eighth of the window."""
    return max(1, min(max_output_tokens, CHECKPOINT_REPLY_CAP, context_window // 8))


def estimate_margin(context_window: int) -> int:
    """Room kept for the estimate's error in every request a checkpoint sends."""
    return max(ESTIMATE_MARGIN_MIN, context_window // ESTIMATE_MARGIN_DEN)


def checkpoint_rounds_room(reply_room: int) -> int:
    """What a checkpoint turn's later requests add to its first: its edits and their
    results (about one reply: a round that reads the two files back is answered in a line,
    their text being in the request already), the notes between rounds, and the one repair
    request."""
    return reply_room + ROUND_NOTES_ROOM + REPAIR_REQUEST_ROOM


def checkpoint_turn_room(context_window: int, max_output_tokens: int,
                         price_step_tokens: int | None = None) -> int:
    """What a checkpoint turn adds to the conversation, all its requests counted: the
    instruction, the previous mind at its limits and a memo checklist as large as the memo
    budget, its reply room, and the rounds after the first (the edits, the notes, the
    repair). The threshold's safety margin covers the estimate's error."""
    window = _effective_window(context_window, price_step_tokens)
    files = sum(mind_section_limits(window).values()) + memo_limits(window)[1]
    reply = checkpoint_reply_room(context_window, max_output_tokens)
    room = CHECKPOINT_INSTRUCTION_ROOM + files + reply + checkpoint_rounds_room(reply)
    return min(room, context_window * CHECKPOINT_TURN_MAX_SHARE_NUM
               // CHECKPOINT_TURN_MAX_SHARE_DEN)


def checkpoint_view_room(context_window: int, reply_room: int, *, tight: bool = False) -> int:
    """The most a checkpoint turn's first request (with its reply room) may weigh so that
    every later request of the turn fits the window too, the estimate's margin kept.
    `tight`: room only for one last request for the now after the first (its edits
    squeezed, no repair): what a request that passed the threshold by more than the margin
    still gets, rather than a view of only the earlier part."""
    later = (2 * ROUND_NOTES_ROOM + MIN_ROUND_REPLY if tight
             else checkpoint_rounds_room(reply_room))
    return context_window - later - estimate_margin(context_window)


def round_reply_room(prompt_tokens: int, context_window: int, reply_room: int,
                     *, tool_round: bool) -> int | None:
    """The reply room of a checkpoint round whose prompt weighs `prompt_tokens` (the API's
    count of the last round plus what it added, estimated): the full reply room when a
    tool round still leaves room for the rounds after it, less down to MIN_ROUND_REPLY for
    the last round; None when not even that fits (the turn ends with what it wrote)."""
    left = context_window - estimate_margin(context_window) - prompt_tokens
    if tool_round:
        left -= ROUND_NOTES_ROOM + MIN_ROUND_REPLY  # a tool round leaves room for the now
    room = min(reply_room, left)
    return room if room >= MIN_ROUND_REPLY else None


def results_room(prompt_tokens: int, reply_tokens: int, context_window: int) -> int:
    """How much a round's tool results may weigh: what leaves the next request room for
    the last round's note and its now (`prompt_tokens`, `reply_tokens`: the API's count of
    this round)."""
    return max(0, context_window - estimate_margin(context_window) - prompt_tokens
               - reply_tokens - ROUND_NOTES_ROOM - MIN_ROUND_REPLY)


def checkpoint_threshold(
    context_window: int,
    max_output_tokens: int,
    price_step_tokens: int | None = None,
    safety_margin: int | None = None,
) -> int:
    """The token count the next request must not pass: past it, the ladder starts.

    The smallest of: 90% of the window (Codex's trigger); the window less the room kept
    for the reply and a safety margin (Claude Code's reserve and margin, which bind on small
    windows with large outputs); the window less the checkpoint turn's own room and the
    margin (so the checkpoint taken here sees everything); and the price step less the
    margin, when the price per token rises above a context size.
    """
    margin = (
        default_safety_margin(context_window, price_step_tokens)
        if safety_margin is None
        else max(0, safety_margin)
    )
    candidates = [
        context_window * THRESHOLD_FRACTION_NUM // THRESHOLD_FRACTION_DEN,
        context_window - reply_reserve(context_window, max_output_tokens) - margin,
        context_window - checkpoint_turn_room(context_window, max_output_tokens,
                                              price_step_tokens) - margin,
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


# The usage ratio (the API's count over Keel's estimate) stays within these: a count
# outside them is a different request's, not a different tokenizer's.
RATIO_MIN, RATIO_MAX = 0.5, 2.0


def learned_ratio(ratio: float, counted: int, estimated: int) -> float:
    """The usage ratio after the API counted `counted` tokens for a request Keel estimated
    at `estimated` (the old `ratio` applied): from a reply's usage or a refusal's words."""
    if counted <= 0 or estimated <= 0:
        return ratio
    return min(RATIO_MAX, max(RATIO_MIN, ratio * counted / estimated))


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


class CheckpointView(StrEnum):
    """What the checkpoint turn is shown of the live window."""

    FULL = "full"  # everything, up to the newest step
    WITHOUT_NEWEST_OUTPUT = "without_newest_output"  # all but the newest tool output's text
    EARLIER = "earlier"  # only the part it condenses, the largest that fits
    NONE = "none"  # not even the smallest earlier part fits


def checkpoint_view(full_tokens: int, without_newest_output_tokens: int | None,
                    earlier: list[tuple[int, int]], room: int) -> tuple[CheckpointView, int | None]:
    """Choose the checkpoint turn's view: the whole conversation when the turn fits `room`
    (the window); else the same without the newest tool output's text (it stays verbatim in
    the tail); else the largest earlier part that fits. `earlier` holds (cut seq, turn
    tokens when only rows before that cut are shown). Returns the view and, for EARLIER,
    its cut seq."""
    if full_tokens <= room:
        return CheckpointView.FULL, None
    if without_newest_output_tokens is not None and without_newest_output_tokens <= room:
        return CheckpointView.WITHOUT_NEWEST_OUTPUT, None
    fitting = [cut for cut, tokens in earlier if tokens <= room]
    if fitting:
        return CheckpointView.EARLIER, max(fitting)
    return CheckpointView.NONE, None


def portion_after_refusal(portion: float) -> float | None:
    """After the API refused a checkpoint turn as too large: try the earlier part once."""
    return EARLIER_PART_PORTION if portion > EARLIER_PART_PORTION else None
