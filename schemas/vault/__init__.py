"""Long memory's pure rules: the vault's schema, cards, graph, rollups, search, recall.

Invariant: nothing here does I/O. The rules take text and values and return text and
values; reading and writing the vault, the database and the clock is `activities.vault`'s
job, so every rule here is tested without a disk, a database or a server. Models that travel
in Temporal histories here (the workflows' inputs and reports, their parts) only gain
optional fields.

`__all__` lists what the other layers (the session, the workflows, the settings) use; the
vault's own activities import the submodules directly.
"""

from schemas.vault.card import CardFact
from schemas.vault.doctor import DoctorInput, DoctorReport, StepResult
from schemas.vault.recall import MemoryHit, fence_memory, scrub_memory_echo
from schemas.vault.rollup import ApplyResult, RollupInput, RollupKind, RollupReport, write_card_tool
from schemas.vault.schema import GitResult, SearchMode, VaultSchema
from schemas.vault.settings import MemorySettings

__all__ = [
    "ApplyResult",
    "CardFact",
    "DoctorInput",
    "DoctorReport",
    "GitResult",
    "MemoryHit",
    "MemorySettings",
    "RollupInput",
    "RollupKind",
    "RollupReport",
    "SearchMode",
    "StepResult",
    "VaultSchema",
    "fence_memory",
    "scrub_memory_echo",
    "write_card_tool",
]
