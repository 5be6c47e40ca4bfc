"""The model call's one seam: a `ModelBackend` (create, stream) and the real adapter.

Invariant: every model request in Keel goes through a `ModelBackend`; the real one is
`AnthropicBackend` (the SDK, Temporal owning retries, errors mapped by `model_error`,
replies checked by `checked_reply`), and `ModelBackends` chooses per request between it and
the offline model (`activities.offline`), which this package never imports on its own.
"""

from activities.model.anthropic_backend import AnthropicBackend, checked_reply, model_error
from activities.model.backend import ModelBackend, ModelBackends, safe_on_text

__all__ = [
    "AnthropicBackend",
    "ModelBackend",
    "ModelBackends",
    "checked_reply",
    "model_error",
    "safe_on_text",
]
