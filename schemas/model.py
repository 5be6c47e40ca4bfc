"""What the model adapter reports, as plain data both sides of an activity can read.

The adapter (`activities.model`) raises `ApplicationError`s of these types; workflows
branch on the types, never on message text.
"""

from __future__ import annotations

# The name the offline deterministic model answers with: what says, in a reply or a footer,
# that no real model wrote it.
OFFLINE_MODEL_NAME = "keel-offline-model"

MODEL_TIMEOUT = "ModelTimeout"
MODEL_CONNECTION = "ModelConnection"
MODEL_ERROR = "ModelError"
MODEL_MALFORMED_REPLY = "ModelMalformedReply"


def http_error_type(status: int) -> str:
    """The error type of an HTTP status the Messages API answered with."""
    return f"ModelHTTP{status}"


# The API refused the request as too large for the model: a smaller request may pass.
REFUSED_AS_TOO_LARGE = frozenset({http_error_type(400), http_error_type(413)})
