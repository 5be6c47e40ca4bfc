"""What the offline model and the test fake know of each model: context window, output limit,
minimum cacheable prefix.

Values as the Anthropic docs give them (prompt-caching "minimum cacheable prompt length",
the models overview's max output). A model name the table does not know falls back to its
family (haiku / sonnet / opus), then to Sonnet-class values, so a test's "fake-model" acts
like a Sonnet.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelLimits:
    context_window: int
    max_output_tokens: int
    min_cacheable_tokens: int


# Specific versions first: the first pattern contained in the model name wins.
_TABLE: list[tuple[str, ModelLimits]] = [
    ("opus-5", ModelLimits(200_000, 128_000, 512)),
    ("opus-4-8", ModelLimits(200_000, 128_000, 1024)),
    ("opus-4-7", ModelLimits(200_000, 128_000, 2048)),
    ("opus-4-6", ModelLimits(200_000, 128_000, 4096)),
    ("opus-4-5", ModelLimits(200_000, 64_000, 4096)),
    ("opus-4-1", ModelLimits(200_000, 32_000, 1024)),
    ("opus-4", ModelLimits(200_000, 32_000, 1024)),
    ("haiku-4-5", ModelLimits(200_000, 64_000, 4096)),
    ("3-5-haiku", ModelLimits(200_000, 8_192, 2048)),
    ("haiku-3-5", ModelLimits(200_000, 8_192, 2048)),
    ("3-haiku", ModelLimits(200_000, 4_096, 2048)),
    ("sonnet-5", ModelLimits(200_000, 64_000, 1024)),
    ("sonnet-4", ModelLimits(200_000, 64_000, 1024)),
    ("3-7-sonnet", ModelLimits(200_000, 64_000, 1024)),
    # Families, for names the table does not list.
    ("haiku", ModelLimits(200_000, 8_192, 2048)),
    ("opus", ModelLimits(200_000, 32_000, 1024)),
    ("sonnet", ModelLimits(200_000, 64_000, 1024)),
]
_DEFAULT = ModelLimits(200_000, 64_000, 1024)


def limits_for(model: str) -> ModelLimits:
    name = model.lower()
    for pattern, limits in _TABLE:
        if pattern in name:
            return limits
    return _DEFAULT
