"""The worker's hold of a fallback model (activities.model.backend.for_attempt): an attempt
that turns to the fallback holds it for the model for `fallback_hold_s`; within it a call's
first attempt asks the fallback, after it the model itself; a model held says nothing of
another."""

from __future__ import annotations

import time

from activities.model.backend import for_attempt
from schemas.config import ModelSettings

SETTINGS = ModelSettings(fallback_model="f", fallback_hold_s=60)


def test_a_held_model_is_asked_of_the_fallback_until_the_hold_ends() -> None:
    request = {"model": "m", "messages": []}
    held: dict[str, float] = {}
    assert for_attempt(SETTINGS, request, held) is request  # attempt 1, nothing held
    held["m"] = time.monotonic() + 30
    assert for_attempt(SETTINGS, request, held) == {"model": "f", "messages": []}
    assert for_attempt(SETTINGS, {"model": "other"}, held) == {"model": "other"}
    held["m"] = time.monotonic() - 1  # its hold over: the model itself again
    assert for_attempt(SETTINGS, request, held) is request
    assert for_attempt(ModelSettings(), request, {"m": time.monotonic() + 30}) is request
