"""The only way the model changes a checkpoint file: replace one exact passage.

An edit that could match in two places, or that would replace the whole file (an empty
`old`), is refused: what the model did not quote stays word for word.
"""

from __future__ import annotations

from typing import Literal

EditErrorReason = Literal["empty", "not_found", "ambiguous"]


class EditError(ValueError):
    def __init__(self, reason: EditErrorReason, message: str) -> None:
        super().__init__(message)
        self.reason: EditErrorReason = reason


def _occurrences(text: str, old: str) -> int:
    # Overlapping matches count too: "aa" occurs twice in "aaa", and either could be meant.
    count, start = 0, text.find(old)
    while start != -1:
        count += 1
        start = text.find(old, start + 1)
    return count


def apply_exact_edit(text: str, old: str, new: str) -> str:
    """`text` with its one occurrence of `old` replaced by `new`."""
    if not old:
        raise EditError(
            "empty",
            "old string is empty: that would overwrite the file. Quote the exact passage "
            "to replace; the file can be edited, never overwritten.",
        )
    found = _occurrences(text, old)
    if found == 0:
        raise EditError(
            "not_found",
            "old string not found in the file: quote the passage exactly as it is now, "
            "including spaces and line breaks.",
        )
    if found > 1:
        raise EditError(
            "ambiguous",
            f"old string found {found} times: include more of the surrounding text so it "
            "matches exactly once.",
        )
    return text.replace(old, new, 1)
