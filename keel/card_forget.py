"""Forgetting one card of a memory scope: `forget_card(keel, scope, card)`, or `keel vault
forget --scope S CARD` (what goes, what stays and why: schemas.vault.forget).

Invariant: the vault's side runs through the vault's one writer (workflows.forget_card, on
its queue); nothing is forgotten when no vault worker serves it, and the caller hears why.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from keel._errors import DeleteRefusedError
from keel.deletion import MEMORY_WAIT_S, vault_served
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
    handle = await keel.client.start_workflow(
        FORGET_CARD_WORKFLOW, ForgetCardInput(scope=scope, card=card),
        id=f"keel-forget-card-{scope}-{uuid.uuid4().hex[:8]}", task_queue=keel.task_queue,
        result_type=CardForgotten)
    try:
        done: CardForgotten = await asyncio.wait_for(handle.result(), MEMORY_WAIT_S)
    except TimeoutError:
        raise DeleteRefusedError(
            f"long memory (scope {scope}) did not answer in {MEMORY_WAIT_S:.0f} s: is a "
            "vault worker running? Forget it again once it answers") from None
    except WorkflowFailureError as err:
        said = err.cause.message if isinstance(err.cause, ApplicationError) else str(err)
        raise DeleteRefusedError(f"the card was not forgotten: {said}; try again") from None
    return done
