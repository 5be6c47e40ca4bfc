"""Removed at merge: the old module-level model calls, kept only so that the callers this
branch may not edit (activities/session.py, activities/checkpoint.py, workers/worker.py)
still run. Each is a thin call into the backends; the worker builds its own
`ModelBackends` instead and passes it to the activities, after which this module goes.

Unlike the real adapter, this module reaches for the offline model (lazily), as the old
`create_message` did; that is one more reason it must not outlive the merge.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from anthropic.types import Message

from activities.heartbeat import with_heartbeat
from activities.model.anthropic_backend import AnthropicBackend
from activities.model.backend import ModelBackends
from schemas.config import ModelSettings

__all__ = ["create_message", "legacy_backends", "stream_message", "with_heartbeat"]


@cache
def legacy_backends() -> ModelBackends:  # removed at merge
    from activities.offline import OfflineBackend

    return ModelBackends(real=AnthropicBackend(), offline=OfflineBackend())


async def create_message(settings: ModelSettings,
                         request: dict[str, Any]) -> Message:  # removed at merge
    return await legacy_backends().create(settings, request)


async def stream_message(settings: ModelSettings, request: dict[str, Any],
                         on_text: Callable[[str], None]) -> Message:  # removed at merge
    return await legacy_backends().stream(settings, request, on_text)
