"""What a reply cost: the API's own usage as Keel's `Usage`, and as the budget's `Spend`
at the worker's price table.

Invariant: every model call a session makes is charged from the usage the API returned
with it, read here one way: a turn's calls (activities.model_call), the checkpoint's rounds
(activities.checkpoint_turn) and the memory flush before a checkpoint (activities.vault.turn).
"""

from __future__ import annotations

from anthropic.types import Message

from schemas.budget import PriceTable, Spend, cost_usd, reply_price, spend_of
from schemas.messages import Usage

__all__ = ["spend_of_reply", "usage_of"]


def usage_of(message: Message) -> Usage:
    """The reply's usage as the API counted it (cache writes by lifetime where it says)."""
    usage = message.usage
    by_ttl = getattr(usage, "cache_creation", None)  # absent from older API versions
    return Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                 cache_read_input_tokens=usage.cache_read_input_tokens or 0,
                 cache_creation_input_tokens=usage.cache_creation_input_tokens or 0,
                 cache_creation_1h_input_tokens=getattr(
                     by_ttl, "ephemeral_1h_input_tokens", 0) or 0)


def spend_of_reply(message: Message, model: str, prices: PriceTable) -> Spend:
    """What the reply to a request for `model` cost, in tokens and dollars
    (`schemas.budget.reply_price`: the offline model's cost nothing)."""
    usage = usage_of(message)
    return spend_of(usage, cost_usd(usage, reply_price(message.model, model, prices)))
