"""Forgetting one card of a memory scope: `forget_card(keel, scope, card)`, or `keel vault
forget --scope S CARD` (what goes, what stays and why: schemas.vault.forget).

Invariant: the vault's side runs through the vault's one writer (workflows.forget_card, on
its queue); nothing is forgotten when no vault worker serves it, and the caller hears why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keel._errors import DeleteRefusedError
from keel.deletion import on_the_vault, vault_served
from schemas.vault.forget import FORGET_CARD_WORKFLOW, CardForgotten, ForgetCardInput
from schemas.vault.scope import ScopeError, check_scope

if TYPE_CHECKING:
    from keel.client import KeelClient

__all__ = ["forget_card"]

MAX_CARD_CHARS = 300  # a title, or a card's vault path


async def forget_card(keel: KeelClient, scope: str, card: str) -> CardForgotten:
    """Forget the card titled `card` (or at vault path `cards/...md`) in `scope`;
    `DeleteRefusedError` says why not."""
    try:
        check_scope(scope)
    except ScopeError as err:
        raise DeleteRefusedError(str(err)) from None
    card = card.strip()
    if not card or len(card) > MAX_CARD_CHARS or not card.isprintable():
        raise DeleteRefusedError(
            f"a card is named by its title or its vault path: printable, 1 to "
            f"{MAX_CARD_CHARS} characters; nothing was forgotten")
    await vault_served(keel, scope)
    return await on_the_vault(keel, FORGET_CARD_WORKFLOW, ForgetCardInput(scope=scope, card=card),
                              CardForgotten, scope=scope, kind="forget-card",
                              not_done="the card was not forgotten", again="try again")
