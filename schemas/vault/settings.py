"""Long memory's settings: where the vault is, when rollups run, how search ranks.

Plain data: reading them from the environment is `KeelSettings.from_env`'s job, and
resolving a missing time zone to the server's is the activities' (activities.vault.clock).

Scopes: the default scope's vault is `vault_dir` (so a deployment's existing single vault
is the default scope's, nothing moved); every other scope's is `<vaults_dir>/<scope>/`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel

from schemas.vault.schema import CORE_MAX_CHARS, SearchMode
from schemas.vault.scope import DEFAULT_SCOPE, check_scope


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

    def vaults_root(self) -> Path:
        return self.vaults_dir or (self.vault_dir.parent / "vaults")

    def vault_dir_for(self, scope: str) -> Path:
        """The vault folder of one scope (the id checked first: it becomes a path)."""
        check_scope(scope)
        if scope == DEFAULT_SCOPE:
            return self.vault_dir
        return self.vaults_root() / scope
