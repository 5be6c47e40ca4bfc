"""The vault's layout and its schema.json: types, statuses, domains, decay.

The schema is data, read from the vault itself, so a person can add a card type without a
code change. Everything that decides whether a type or status is valid goes through
`VaultSchema` so the write tool, the rollup and the doctor apply one rule.
"""

from __future__ import annotations

import json
from enum import StrEnum

from pydantic import BaseModel, Field, ValidationError

# Fixed places inside a vault. Everything else is data described by schema.json.
CORE_FILE = "CORE.md"
MOC_FILE = "MOC.md"
SCHEMA_FILE = "schema.json"
CARDS_DIR = "cards"
DAILY_DIR = "daily"
SUMMARIES_DIR = "summaries"
GRAPH_DIR = ".graph"
LOCK_FILE = ".keel.lock"

CORE_MAX_CHARS = 1_200
CORE_MAX_GOALS = 3


class CardOp(StrEnum):
    ADD = "ADD"
    SUPERSEDE = "SUPERSEDE"
    NOOP = "NOOP"


class Confidence(StrEnum):
    EXTRACTED = "EXTRACTED"  # the user said it
    INFERRED = "INFERRED"  # deduced: answers hedge it


class SearchMode(StrEnum):
    AUTO = "auto"  # hybrid when an embedding model is installed, else BM25
    BM25 = "bm25"
    HYBRID = "hybrid"  # BM25 and dense, fused; an error when no model is installed


class TypeSpec(BaseModel):
    folder: str
    statuses: list[str] = Field(min_length=1)
    default_status: str
    aliases: list[str] = Field(default_factory=list)
    description: str = ""


class DecaySpec(BaseModel):
    # relevance = max(floor, 1 - rate / strength * days); strength = 1 + ln(accesses)
    rates: dict[str, float] = Field(default_factory=dict)
    default_rate: float = 0.02
    floor: float = 0.1
    # Days since last touch at which a card drops to the next tier.
    tiers: dict[str, int] = Field(default_factory=lambda: {"hot": 0, "warm": 7, "cool": 21,
                                                           "cold": 60})
    stale_tier: str = "cold"


class VaultSchema(BaseModel):
    version: int = 1
    types: dict[str, TypeSpec]
    domains: list[str] = Field(default_factory=list)
    default_domain: str | None = None
    decay: DecaySpec = Field(default_factory=DecaySpec)
    # Statuses that mean "no longer true": such cards sink in search.
    superseded_statuses: list[str] = Field(default_factory=list)

    def resolve_type(self, name: str | None) -> str | None:
        """The canonical type for a name or alias (case-insensitive); None if unknown."""
        if not name:
            return None
        key = name.strip().casefold()
        for canonical, spec in self.types.items():
            if key == canonical.casefold() or key in (a.casefold() for a in spec.aliases):
                return canonical
        return None

    def valid_status(self, card_type: str, status: str | None) -> bool:
        spec = self.types.get(card_type)
        return spec is not None and status is not None and status in spec.statuses

    def all_statuses(self) -> list[str]:
        seen: dict[str, None] = {}
        for spec in self.types.values():
            for s in spec.statuses:
                seen.setdefault(s, None)
        return list(seen)

    def folder_of(self, card_type: str) -> str:
        return self.types[card_type].folder


class SchemaProblem(BaseModel):
    where: str
    problem: str


def parse_schema(text: str) -> tuple[VaultSchema | None, list[SchemaProblem]]:
    """Read schema.json; every problem is listed, and a broken schema yields None.

    A schema whose aliases, decay rates or defaults name a type it does not define is
    rejected as a whole: guessing would re-type cards on the next doctor run.
    """
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        return None, [SchemaProblem(where=SCHEMA_FILE, problem=f"not valid JSON: {err}")]
    try:
        schema = VaultSchema.model_validate(raw)
    except ValidationError as err:
        return None, [
            SchemaProblem(where=".".join(str(p) for p in e["loc"]) or SCHEMA_FILE,
                          problem=e["msg"])
            for e in err.errors()
        ]
    problems: list[SchemaProblem] = []
    seen_names: dict[str, str] = {}
    for name, spec in schema.types.items():
        if spec.default_status not in spec.statuses:
            problems.append(SchemaProblem(
                where=f"types.{name}.default_status",
                problem=f"{spec.default_status!r} is not one of {spec.statuses}"))
        if not spec.folder.startswith(CARDS_DIR + "/") or ".." in spec.folder:
            problems.append(SchemaProblem(
                where=f"types.{name}.folder", problem=f"{spec.folder!r} is not under cards/"))
        for alias in [name, *spec.aliases]:
            key = alias.casefold()
            if key in seen_names and seen_names[key] != name:
                problems.append(SchemaProblem(
                    where=f"types.{name}.aliases",
                    problem=f"{alias!r} already names type {seen_names[key]!r}"))
            seen_names[key] = name
    for name in schema.decay.rates:
        if name not in schema.types:
            problems.append(SchemaProblem(
                where=f"decay.rates.{name}", problem=f"unknown type {name!r}"))
    if schema.default_domain and schema.default_domain not in schema.domains:
        problems.append(SchemaProblem(
            where="default_domain", problem=f"{schema.default_domain!r} is not in domains"))
    if schema.decay.stale_tier not in schema.decay.tiers:
        problems.append(SchemaProblem(
            where="decay.stale_tier", problem=f"{schema.decay.stale_tier!r} is not a tier"))
    return (None if problems else schema), problems



# --- the commit's result (part of the doctor's report, so it stays with the rules) ------


class GitResult(BaseModel):
    committed: bool = False
    pushed: bool = False
    commit: str | None = None
    problem: str | None = None
    push_problem: str | None = None
    notes: list[str] = Field(default_factory=list)  # what was set right first (a stale lock)
