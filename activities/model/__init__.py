"""The model call's one seam: a `ModelBackend` (create, stream) and the real adapter.

Invariant: every model request in Keel goes through a `ModelBackend`; the real one is
`AnthropicBackend` (the SDK, Temporal owning retries, errors mapped by `model_error`,
replies checked by `checked_reply`), and `ModelBackends` chooses per request between it and
the offline model (`activities.offline`), which this package never imports on its own.
"""

from activities.model.anthropic_backend import AnthropicBackend, checked_reply, model_error
from activities.model.backend import ModelBackend, ModelBackends, safe_on_text

# Removed at merge: the old module-level calls, for the callers this branch may not edit.
from activities.model.legacy import create_message, stream_message, with_heartbeat

__all__ = [
    "AnthropicBackend",
    "ModelBackend",
    "ModelBackends",
    "checked_reply",
    "create_message",
    "model_error",
    "safe_on_text",
    "stream_message",
    "with_heartbeat",
]
