"""Long memory's settings: where the vault is, when rollups run, how search ranks.

Plain data: reading them from the environment is `KeelSettings.from_env`'s job, and
resolving a missing time zone to the server's is the activities' (activities.vault.clock).

Scopes: the default scope's vault is `vault_dir` (so a deployment's existing single vault
is the default scope's, nothing moved); every other scope's is `<vaults_dir>/<scope>/`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, field_validator

from schemas.vault.schema import CORE_MAX_CHARS, SearchMode
from schemas.vault.scope import DEFAULT_SCOPE, check_scope

# Each nightly job's cron spec (MemorySettings.<job>_cron) and the variable that sets it.
CRON_VARIABLES = {
    "daily": "KEEL_ROLLUP_DAILY_CRON",
    "weekly": "KEEL_ROLLUP_WEEKLY_CRON",
    "monthly": "KEEL_ROLLUP_MONTHLY_CRON",
    "yearly": "KEEL_ROLLUP_YEARLY_CRON",
    "doctor": "KEEL_DOCTOR_CRON",
}
ZONE_WANTED = "a time zone this server knows (an IANA name: Europe/Paris, America/New_York, UTC)"


def known_timezone(name: str) -> bool:
    """Whether this host can load `name` as a time zone (the vault's days and the nightly
    schedules are kept in it)."""
    try:
        ZoneInfo(name)
        return True
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return False


class MemorySettings(BaseModel):
    """Long memory's settings (the vault, rollup times, search): `KeelSettings.memory`."""

    vault_dir: Path  # the default scope's vault
    # Where every other scope's vault lives; None: `vaults` beside vault_dir.
    vaults_dir: Path | None = None
    # None: the server's zone, resolved where it is used (activities.vault.clock).
    timezone: str | None = "UTC"
    daily_cron: str = "0 4 * * *"
    weekly_cron: str = "15 4 * * 0"
    monthly_cron: str = "20 4 1 * *"
    yearly_cron: str = "25 4 1 1 *"
    doctor_cron: str = "0 5 * * *"
    # A run missed while the worker was down still runs when it returns, within this window.
    catchup_window: timedelta = timedelta(days=3)
    notify_webhook_url: str | None = None
    search_mode: SearchMode = SearchMode.AUTO
    # KEEL_EMBEDDER (activities.vault.embedder.load_embedder): None / "auto" is the
    # built-in model when the `embeddings` extra is installed; "none"; a built-in name;
    # "module:factory" returning an Embedder; "hashing" (a test stand-in, never chosen
    # unless named).
    embedder: str | None = None
    core_max_chars: int = CORE_MAX_CHARS
    # The biggest slice of transcript one rollup request carries; longer days are chunked.
    rollup_chunk_tokens: int = 60_000
    rollup_max_output_tokens: int = 4_096
    git_push: bool = True
    # A health score this many points under the previous one asks for a person.
    health_drop_alert: float = 5.0

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        # Every vault write asks the zone for the local day: one it cannot load would fail
        # them all (transcripts never written) while sessions ran on.
        if value is not None and not known_timezone(value):
            raise ValueError(f"{value[:60]!r} is not {ZONE_WANTED}")
        return value

    def vaults_root(self) -> Path:
        return self.vaults_dir or (self.vault_dir.parent / "vaults")

    def vault_dir_for(self, scope: str) -> Path:
        """The vault folder of one scope (the id checked first: it becomes a path)."""
        check_scope(scope)
        if scope == DEFAULT_SCOPE:
            return self.vault_dir
        return self.vaults_root() / scope
