"""Budgets: what a session and a turn may spend, what they have spent, and what to do when
a limit is reached. Pure: no I/O, no clock.

Invariants:
- Spend is counted from the API's usage of each model call: `input_tokens` are the
  uncached input plus the cache writes, `cached_tokens` the cache reads, `output_tokens`
  the output; dollars from a per-model price table (`PriceTable`, settings), computed by
  the activity that saw the usage, so a history replays the same figures on any worker.
- A limit is reached when the spend is at or over it (`reached`). A budget is checked
  before a model call, never during one: a reply is never half-written for a budget, and
  no call is refused silently. A reached limit pauses the turn with a `BudgetRequest` a
  person answers (`BudgetAnswer`: raise by an amount, or refuse).
- A turn's limit counts this turn only; what a raise adds to it lasts for this turn. A
  raise of the session's limit lasts for the session.
- A limit the spend comes near (`warn_at` of it, 80% unless the spec says) is said once,
  before it is reached, and again only once a raise moved it (`near`, `warnings`).
- A child's budget is a share of what its parent has left (`child_share`), given in the
  child's spec like any budget; the child's spend is added to the parent's
  (`BudgetState.add_child`) when it reports.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

from schemas.messages import Usage
from schemas.model import OFFLINE_PREFIX
from schemas.strict import SpecModel

__all__ = [
    "CHILD_SHARE",
    "DEFAULT_PRICES",
    "BudgetAnswer",
    "BudgetLimits",
    "BudgetRequest",
    "BudgetScope",
    "BudgetSpec",
    "BudgetState",
    "BudgetWarning",
    "ModelPrice",
    "PriceTable",
    "Spend",
    "against",
    "answered_notice",
    "as_much_again",
    "budget_notice",
    "child_budget",
    "child_share",
    "cost_usd",
    "near",
    "price_for",
    "raise_problem",
    "reached",
    "reply_price",
    "spend_of",
    "warning_notice",
]

MTOK = 1_000_000
DEFAULT_WARN_AT = 0.8  # of a limit: where a session says its budget is near


class ModelPrice(BaseModel):
    """Dollars per million tokens: input, output, cache reads, cache writes of five minutes
    and of an hour (unset: twice the input's, Anthropic's list shape)."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_read: float = Field(ge=0)
    cache_write: float = Field(ge=0)
    cache_write_1h: float | None = Field(default=None, ge=0)

    @property
    def hour_write(self) -> float:
        return self.cache_write_1h if self.cache_write_1h is not None else self.input * 2


def _price(inp: float, out: float) -> ModelPrice:
    """Anthropic's list-price shape: cache reads a tenth of input, writes a quarter more."""
    return ModelPrice(input=inp, output=out, cache_read=round(inp * 0.1, 6),
                      cache_write=round(inp * 1.25, 6))


# List prices of current Anthropic models (USD per million tokens) by model-name prefix;
# the longest matching prefix wins. Override or extend with KEEL_PRICES (settings).
DEFAULT_PRICES: dict[str, ModelPrice] = {
    "claude-opus-4-5": _price(5.0, 25.0),
    "claude-opus-4-1": _price(15.0, 75.0),
    "claude-opus-4": _price(15.0, 75.0),
    "claude-opus": _price(5.0, 25.0),
    "claude-sonnet": _price(3.0, 15.0),
    "claude-3-7-sonnet": _price(3.0, 15.0),
    "claude-haiku-4-5": _price(1.0, 5.0),
    "claude-haiku": _price(1.0, 5.0),
    "claude-3-5-haiku": _price(0.8, 4.0),
}

PriceTable = dict[str, ModelPrice]


def price_for(model: str, table: PriceTable) -> ModelPrice | None:
    """The price of `model`: the entry whose name is the longest prefix of it, or None."""
    best = max((name for name in table if model.startswith(name)), key=len, default=None)
    return table[best] if best is not None else None


def reply_price(answered: str | None, asked: str, table: PriceTable) -> ModelPrice | None:
    """The price of a reply: the model the API says answered (a dated name under the
    alias asked for), else the one asked for; none for Keel's offline models, which bill
    nothing."""
    if answered and answered.startswith(OFFLINE_PREFIX):
        return None
    return (price_for(answered, table) if answered else None) or price_for(asked, table)


def cost_usd(usage: Usage, price: ModelPrice | None) -> float:
    """What one call's usage cost at `price` (0 when the model has no price)."""
    if price is None:
        return 0.0
    return (usage.input_tokens * price.input + usage.output_tokens * price.output
            + usage.cache_read_input_tokens * price.cache_read
            + (usage.cache_creation_input_tokens - usage.cache_creation_1h_input_tokens)
            * price.cache_write
            + usage.cache_creation_1h_input_tokens * price.hour_write) / MTOK


class Spend(BaseModel):
    """What was spent: tokens as the API counted them, and dollars."""

    input_tokens: int = 0  # uncached input and cache writes
    cached_tokens: int = 0  # cache reads
    output_tokens: int = 0
    usd: float = 0.0

    def plus(self, other: Spend) -> Spend:
        return Spend(input_tokens=self.input_tokens + other.input_tokens,
                     cached_tokens=self.cached_tokens + other.cached_tokens,
                     output_tokens=self.output_tokens + other.output_tokens,
                     usd=round(self.usd + other.usd, 9))

    def said(self) -> str:
        return (f"${self.usd:.4f}, {self.input_tokens} input / {self.cached_tokens} cached "
                f"/ {self.output_tokens} output tokens")


def spend_of(usage: Usage, usd: float) -> Spend:
    """One call's usage as spend."""
    return Spend(input_tokens=usage.input_tokens + usage.cache_creation_input_tokens,
                 cached_tokens=usage.cache_read_input_tokens,
                 output_tokens=usage.output_tokens, usd=usd)


class BudgetLimits(SpecModel):
    """Limits on spend; a field left out is no limit."""

    # Finite: JSON has no infinity (it would arrive as null, no limit at all).
    usd: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    input_tokens: int | None = Field(default=None, ge=0)
    cached_tokens: int | None = Field(default=None, ge=0)
    output_tokens: int | None = Field(default=None, ge=0)

    def raised(self, by: BudgetLimits) -> BudgetLimits:
        """These limits with `by` added (a limit `by` sets where none was becomes one)."""
        def add(a: float | None, b: float | None) -> float | None:
            return a if b is None else (b if a is None else a + b)
        return BudgetLimits(
            usd=add(self.usd, by.usd),
            input_tokens=_int(add(self.input_tokens, by.input_tokens)),
            cached_tokens=_int(add(self.cached_tokens, by.cached_tokens)),
            output_tokens=_int(add(self.output_tokens, by.output_tokens)))

    def any(self) -> bool:
        return any(v is not None for v in self.model_dump().values())


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


class BudgetSpec(SpecModel):
    """An agent spec's budget: per session (all turns), per turn, or both."""

    session: BudgetLimits | None = None
    turn: BudgetLimits | None = None
    # The share of a limit at which the session says it is near, once per limit (and again
    # once a raise moved the limit); None: never.
    warn_at: float | None = Field(default=DEFAULT_WARN_AT, gt=0, lt=1)


class BudgetScope(StrEnum):
    SESSION = "session"
    TURN = "turn"


class BudgetWarning(BaseModel):
    """A limit the spend has come near (at `warn_at` of it, not yet at it)."""

    scope: BudgetScope
    limit: str  # usd, input_tokens, cached_tokens or output_tokens
    at: float  # the limit when it was said: a raise that moves it warns again
    said: str  # "$4.0100 of $5.0000"
    share: float  # of the limit spent


# The limits a budget can set, each a field of `BudgetLimits` and of `Spend`, in the order
# they are said.
LIMITS = ("usd", "input_tokens", "cached_tokens", "output_tokens")


def _said(name: str, spent: float, limit: float) -> str:
    if name == "usd":
        return f"${spent:.4f} of ${limit:.4f}"
    return f"{int(spent)} of {int(limit)} {name.replace('_', ' ')}"


def reached(spent: Spend, limits: BudgetLimits | None) -> list[str]:
    """Every limit `spent` is at or over, said ("$0.0100 of $0.0100"); [] when none."""
    if limits is None:
        return []
    return [_said(name, getattr(spent, name), limit) for name in LIMITS
            if (limit := getattr(limits, name)) is not None and getattr(spent, name) >= limit]


def against(spent: Spend, limits: BudgetLimits | None) -> list[str]:
    """What is spent of each limit in force ("$0.3001 of $0.3500, 86%"); [] when none."""
    if limits is None:
        return []
    out = []
    for name in LIMITS:
        limit = getattr(limits, name)
        if limit is not None:
            used = getattr(spent, name)
            out.append(_said(name, used, limit) + (f", {used / limit:.0%}" if limit else ""))
    return out


def near(spent: Spend, limits: BudgetLimits | None, scope: BudgetScope, warn_at: float | None,
         warned: dict[str, float]) -> list[BudgetWarning]:
    """Each limit `spent` has come to `warn_at` of without reaching it, not yet said at that
    limit (`warned`: "scope:limit" -> the limit it was said at)."""
    if limits is None or warn_at is None:
        return []
    out = []
    for name in LIMITS:
        limit, used = getattr(limits, name), getattr(spent, name)
        if not limit or warned.get(f"{scope.value}:{name}") == limit:
            continue
        if warn_at * limit <= used < limit:
            out.append(BudgetWarning(scope=scope, limit=name, at=limit,
                                     said=_said(name, used, limit), share=used / limit))
    return out


def warning_notice(warning: BudgetWarning) -> str:
    """The record's line when a limit comes near."""
    return (f"The {warning.scope.value}'s budget is {warning.share:.0%} spent "
            f"({warning.said}); at the limit the turn pauses until a person raises it.")


class BudgetRequest(BaseModel):
    """A reached budget waiting on a person: the turn is paused before its next call."""

    request_id: str
    scope: BudgetScope
    reached: list[str]
    spent: Spend
    limits: BudgetLimits
    turn: int
    since: datetime


def as_much_again(request: BudgetRequest) -> tuple[BudgetLimits, str]:
    """The raise that lets a paused turn spend as much again of each limit it reached:
    its spend past the limit, plus the limit (at least a cent, or a token), and
    that allowance said ("20 output tokens"). Limits not reached are not raised; a raise
    of one would not let the turn go on."""
    limits, spent = request.limits, request.spent
    raise_by: dict[str, float] = {}
    said: list[str] = []
    for name, least in (("usd", 0.01), ("input_tokens", 1), ("cached_tokens", 1),
                        ("output_tokens", 1)):
        limit, used = getattr(limits, name), getattr(spent, name)
        if limit is None or used < limit:
            continue
        allowance = max(limit, least)
        raise_by[name] = used - limit + allowance
        said.append(f"${allowance:.4f}" if name == "usd"
                    else f"{allowance:,} {name.replace('_', ' ')}")
    return BudgetLimits.model_validate(raise_by), " and ".join(said)


def raise_problem(request: BudgetRequest, raise_by: BudgetLimits) -> str | None:
    """Why a raise cannot let the paused turn go on, or None: each amount must be more than
    nothing and raise a limit in force (a raise of one not in force would start a new limit
    of that size), and one of them a limit the request reached. A raise that is only too
    small is taken: the turn pauses again, saying so."""
    raised_reached = False
    for name, label in _LIMIT_LABELS.items():
        amount, limit = getattr(raise_by, name), getattr(request.limits, name)
        if amount is None:
            continue
        if amount <= 0:
            return f"a raise is of more than nothing (the {label} by {amount:g})"
        if limit is None:
            return f"the {request.scope.value}'s budget has no {label} limit to raise"
        raised_reached |= getattr(request.spent, name) >= limit
    if not raised_reached:
        return (f"the raise leaves what was reached as it was ({'; '.join(request.reached)}):"
                " raise that")
    return None


_LIMIT_LABELS = {"usd": "dollars", "input_tokens": "input tokens",
                 "cached_tokens": "cached tokens", "output_tokens": "output tokens"}


class BudgetAnswer(BaseModel):
    """A person's answer to a `BudgetRequest`: raise the limit by `raise_by`, or refuse
    (the turn ends, saying so). `request_id` None: whichever request is pending."""

    request_id: str | None = None
    raise_by: BudgetLimits | None = None
    refuse: bool = False
    by: str = "user"
    note: str = ""

    def problem(self) -> str | None:
        if self.refuse == (self.raise_by is not None and self.raise_by.any()):
            return "a budget answer either raises a limit (an amount) or refuses, not both"
        return None


class BudgetState(BaseModel):
    """What the session has spent and been granted; carried over continue-as-new."""

    spent: Spend = Field(default_factory=Spend)  # the session's, children included
    turn_spent: Spend = Field(default_factory=Spend)  # this turn's
    turn_of: int = 0  # the turn `turn_spent` counts
    session_raised: BudgetLimits = Field(default_factory=BudgetLimits)
    turn_raised: BudgetLimits = Field(default_factory=BudgetLimits)  # for `turn_of` only
    request: BudgetRequest | None = None  # the pause waiting on a person
    refused: str | None = None  # the last request a person refused to raise
    requests_made: int = 0  # for request ids
    # Limits said to be near: "scope:limit" -> the limit it was said at (a turn's: this one's).
    warned: dict[str, float] = Field(default_factory=dict)

    def start_turn(self, turn: int) -> None:
        if turn != self.turn_of:
            self.turn_of, self.turn_spent = turn, Spend()
            self.turn_raised = BudgetLimits()
            self.warned = {k: v for k, v in self.warned.items()
                           if not k.startswith(f"{BudgetScope.TURN.value}:")}

    def warnings(self, spec: BudgetSpec | None) -> list[BudgetWarning]:
        """The limits the spend has come near since they were last said, now said."""
        if spec is None:
            return []
        out = [*near(self.spent, self.limits(spec, BudgetScope.SESSION), BudgetScope.SESSION,
                     spec.warn_at, self.warned),
               *near(self.turn_spent, self.limits(spec, BudgetScope.TURN), BudgetScope.TURN,
                     spec.warn_at, self.warned)]
        for w in out:
            self.warned[f"{w.scope.value}:{w.limit}"] = w.at
        return out

    def charge(self, spend: Spend, *, in_turn: bool = True) -> None:
        """On the session's spend, and on the turn's unless spent between turns (a
        checkpoint a person asked for)."""
        self.spent = self.spent.plus(spend)
        if in_turn:
            self.turn_spent = self.turn_spent.plus(spend)

    def add_child(self, spend: Spend) -> None:
        """A child session's reported spend, counted against this session's budget."""
        self.charge(spend)

    def limits(self, spec: BudgetSpec | None, scope: BudgetScope) -> BudgetLimits | None:
        """The limits in force: the spec's, with what was raised added."""
        base = (spec.session if scope is BudgetScope.SESSION else spec.turn) if spec else None
        extra = self.session_raised if scope is BudgetScope.SESSION else self.turn_raised
        if base is None and not extra.any():
            return None
        return (base or BudgetLimits()).raised(extra)

    def check(self, spec: BudgetSpec | None) -> tuple[BudgetScope, list[str]] | None:
        """The first budget reached (the session's before the turn's), or None."""
        for scope, spent in ((BudgetScope.SESSION, self.spent),
                             (BudgetScope.TURN, self.turn_spent)):
            said = reached(spent, self.limits(spec, scope))
            if said:
                return scope, said
        return None

    def grant(self, scope: BudgetScope, by: BudgetLimits) -> None:
        if scope is BudgetScope.SESSION:
            self.session_raised = self.session_raised.raised(by)
        else:
            self.turn_raised = self.turn_raised.raised(by)


# Of what a parent has left of its session budget, what one child may spend.
CHILD_SHARE = 0.5


def child_budget(parent: BudgetSpec | None, spent: Spend,
                 fraction: float = CHILD_SHARE) -> BudgetSpec | None:
    """A child session's budget: `fraction` of what the parent has left of its session's
    (its per-turn limit as the parent's); None when the parent has none."""
    if parent is None:
        return None
    return parent.model_copy(update={"session": child_share(parent.session, spent, fraction)
                                     if parent.session else None})


def child_share(limits: BudgetLimits | None, spent: Spend, fraction: float) -> BudgetLimits:
    """A child's session budget: `fraction` of what the parent has left under `limits`
    (no limit where the parent has none)."""
    if limits is None:
        return BudgetLimits()
    fraction = min(max(fraction, 0.0), 1.0)

    def left(limit: float | None, used: float) -> float | None:
        return None if limit is None else max(limit - used, 0) * fraction
    return BudgetLimits(
        usd=left(limits.usd, spent.usd),
        input_tokens=_int(left(limits.input_tokens, spent.input_tokens)),
        cached_tokens=_int(left(limits.cached_tokens, spent.cached_tokens)),
        output_tokens=_int(left(limits.output_tokens, spent.output_tokens)))


def budget_notice(request: BudgetRequest) -> str:
    """The record's line when a turn pauses on its budget."""
    return (f"The {request.scope.value}'s budget is reached ({'; '.join(request.reached)}; "
            f"spent {request.spent.said()}). The turn is paused until a person raises it "
            f"(keel budget SESSION --raise AMOUNT) or refuses (--refuse). Request "
            f"{request.request_id}.")


def answered_notice(request: BudgetRequest, answer: BudgetAnswer) -> str:
    if answer.refuse:
        what = "refused a raise: the turn ends here"
    else:
        assert answer.raise_by is not None
        raised = {k: v for k, v in answer.raise_by.model_dump().items() if v is not None}
        what = "raised it by " + ", ".join(
            f"${v:.4f}" if k == "usd" else f"{v} {k.replace('_', ' ')}"
            for k, v in raised.items())
    note = f" ({answer.note})" if answer.note else ""
    return f"Budget request {request.request_id}: {answer.by} {what}{note}."
