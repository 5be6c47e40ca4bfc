"""The vault's settings and its schema.json: types, statuses, domains, decay.

The schema is data, read from the vault itself, so a person can add a card type without a
code change. Everything that decides whether a type or status is valid goes through
`VaultSchema` so the write tool, the rollup and the doctor apply one rule.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

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
    BM25 = "bm25"
    HYBRID = "hybrid"


def local_timezone_name(env: dict[str, str] | None = None) -> str:
    """The server's IANA zone name: rollups run on server-local time unless configured."""
    e = os.environ if env is None else env
    if e.get("TZ", "").strip(":"):
        return e["TZ"].strip(":")
    try:
        target = os.readlink("/etc/localtime")
        marker = "zoneinfo/"
        if marker in target:
            return target.split(marker, 1)[1]
    except OSError:
        pass
    try:
        name = Path("/etc/timezone").read_text().strip()
        if name:
            return name
    except OSError:
        pass
    return "UTC"


class MemorySettings(BaseModel):
    """Long memory's settings (the vault, rollup times, search). Read once per process."""

    vault_dir: Path
    timezone: str = "UTC"
    daily_cron: str = "0 4 * * *"
    weekly_cron: str = "15 4 * * 0"
    monthly_cron: str = "20 4 1 * *"
    yearly_cron: str = "25 4 1 1 *"
    doctor_cron: str = "0 5 * * *"
    # A run missed while the worker was down still runs when it returns, within this window.
    catchup_window: timedelta = timedelta(days=3)
    notify_webhook_url: str | None = None
    search_mode: SearchMode = SearchMode.BM25
    # "module:factory" returning an `activities.search.Embedder`; "hashing" is the built-in
    # dependency-free one (a baseline, not a semantic model).
    embedder: str | None = None
    core_max_chars: int = CORE_MAX_CHARS
    # The biggest slice of transcript one rollup request carries; longer days are chunked.
    rollup_chunk_tokens: int = 60_000
    rollup_max_output_tokens: int = 4_096
    git_push: bool = True
    # A health score this many points under the previous one asks for a person.
    health_drop_alert: float = 5.0

    @classmethod
    def from_env(cls, data_dir: Path, env: dict[str, str] | None = None) -> MemorySettings:
        e = dict(os.environ if env is None else env)
        vault = e.get("KEEL_VAULT_DIR")
        values: dict[str, Any] = {
            "vault_dir": Path(vault).resolve() if vault else (data_dir / "vault"),
            "timezone": e.get("KEEL_MEMORY_TZ") or local_timezone_name(e),
            "notify_webhook_url": e.get("KEEL_NOTIFY_WEBHOOK") or None,
            "search_mode": e.get("KEEL_MEMORY_SEARCH_MODE", SearchMode.BM25.value),
            "embedder": e.get("KEEL_EMBEDDER") or None,
            "git_push": e.get("KEEL_VAULT_PUSH", "1") not in ("0", "false", "no"),
        }
        for key, name in (
            ("daily_cron", "KEEL_ROLLUP_DAILY_CRON"),
            ("weekly_cron", "KEEL_ROLLUP_WEEKLY_CRON"),
            ("monthly_cron", "KEEL_ROLLUP_MONTHLY_CRON"),
            ("yearly_cron", "KEEL_ROLLUP_YEARLY_CRON"),
            ("doctor_cron", "KEEL_DOCTOR_CRON"),
        ):
            if e.get(name):
                values[key] = e[name]
        return cls(**values)


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



# --- activity payloads (durable contracts: add fields only as optional) ---------------


class GitResult(BaseModel):
    committed: bool = False
    pushed: bool = False
    commit: str | None = None
    problem: str | None = None
    push_problem: str | None = None


class InitVaultResult(BaseModel):
    vault_dir: str
    notes: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    indexed: int = 0


class ReindexInput(BaseModel):
    reason: str = ""


class ReindexResult(BaseModel):
    changed: int
    removed: int


class NotifyInput(BaseModel):
    title: str
    text: str
    level: str = "info"  # info | warning | error


class NotifyResult(BaseModel):
    channel: str  # webhook | log
    delivered: bool
    problem: str | None = None


class CommitInput(BaseModel):
    message: str
