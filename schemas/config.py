"""Keel's settings, read from the environment once per process.

Workflow code never reads these: what a session needs (window, output limit, thresholds)
travels inside `SessionConfig`, so it is recorded in the workflow's history and replays
the same on any worker.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from schemas.vault.schema import SearchMode
from schemas.vault.settings import MemorySettings

DEFAULT_TASK_QUEUE = "keel-sessions"
DEFAULT_MODEL = "claude-sonnet-5"


class ModelSettings(BaseModel):
    """How to reach the model. No API key means the offline deterministic model."""

    name: str = DEFAULT_MODEL
    base_url: str | None = None
    api_key: str | None = None
    context_window: int = 200_000
    max_output_tokens: int = 8_192
    # Where the price per token rises (for example 200,000 on long-context pricing); a
    # checkpoint starts before the context would cross it. None: no price step.
    price_step_tokens: int | None = None
    request_timeout_s: float = 600.0

    @property
    def offline(self) -> bool:
        return not self.api_key and not self.base_url


class ProviderProfile(BaseModel):
    """A named way to reach a Messages-API server. A session names the profile; only the
    worker holds the values (read from its own environment), so no secret is in a history."""

    base_url: str | None = None
    api_key: str | None = None


def providers_from_env(e: dict[str, str]) -> dict[str, ProviderProfile]:
    """`KEEL_PROVIDERS=a,b` with `KEEL_PROVIDER_A_BASE_URL` / `KEEL_PROVIDER_A_API_KEY`."""
    out: dict[str, ProviderProfile] = {}
    for name in (n.strip() for n in e.get("KEEL_PROVIDERS", "").split(",")):
        if name:
            key = name.upper().replace("-", "_")
            out[name] = ProviderProfile(
                base_url=e.get(f"KEEL_PROVIDER_{key}_BASE_URL") or None,
                api_key=e.get(f"KEEL_PROVIDER_{key}_API_KEY") or None)
    return out


class KeelSettings(BaseModel):
    temporal_address: str | None = None
    temporal_namespace: str = "default"
    task_queue: str = DEFAULT_TASK_QUEUE
    database_url: str | None = None
    data_dir: Path = Path(".keel")
    model: ModelSettings = Field(default_factory=ModelSettings)
    max_message_chars: int = 200_000
    user_name: str = "user"
    log_format: str = "console"  # console | json
    otel_exporter: str | None = None  # None | console | otlp
    # Long memory; by default the vault is data_dir/vault on the server's time zone.
    memory: MemorySettings = Field(default_factory=lambda data: default_memory(data["data_dir"]))
    # Provider profiles by name; "default" (this model's own) and "offline" always exist.
    providers: dict[str, ProviderProfile] = Field(default_factory=dict)

    def provider_names(self) -> list[str]:
        return sorted({"default", "offline", *self.providers})

    def model_for(self, provider: str | None) -> ModelSettings:
        """The model settings a session's profile names; KeyError for an unknown one."""
        if provider is None or provider == "default":
            return self.model
        if provider == "offline":
            return self.model.model_copy(update={"base_url": None, "api_key": None})
        profile = self.providers[provider]
        return self.model.model_copy(update={"base_url": profile.base_url,
                                             "api_key": profile.api_key})

    @property
    def workspaces_dir(self) -> Path:
        return self.data_dir / "workspaces"

    @property
    def scratch_dir(self) -> Path:
        return self.data_dir / "scratch"

    @property
    def skills_dir(self) -> Path:
        return self.data_dir / "skills"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> KeelSettings:
        e = dict(os.environ if env is None else env)

        def opt_int(name: str) -> int | None:
            value = e.get(name)
            return int(value) if value else None

        model = ModelSettings(
            name=e.get("KEEL_MODEL", DEFAULT_MODEL),
            base_url=e.get("ANTHROPIC_BASE_URL") or None,
            api_key=e.get("ANTHROPIC_API_KEY") or None,
            context_window=opt_int("KEEL_CONTEXT_WINDOW") or 200_000,
            max_output_tokens=opt_int("KEEL_MAX_OUTPUT_TOKENS") or 8_192,
            price_step_tokens=opt_int("KEEL_PRICE_STEP_TOKENS"),
        )
        data_dir = Path(e.get("KEEL_DATA_DIR", ".keel")).resolve()
        return cls(
            temporal_address=e.get("TEMPORAL_ADDRESS") or None,
            temporal_namespace=e.get("TEMPORAL_NAMESPACE", "default"),
            task_queue=e.get("KEEL_TASK_QUEUE", DEFAULT_TASK_QUEUE),
            database_url=e.get("DATABASE_URL") or None,
            data_dir=data_dir,
            model=model,
            max_message_chars=opt_int("KEEL_MAX_MESSAGE_CHARS") or 200_000,
            user_name=e.get("KEEL_USER_NAME", "user"),
            log_format=e.get("KEEL_LOG_FORMAT", "console"),
            otel_exporter=e.get("KEEL_OTEL_EXPORTER") or None,
            memory=memory_from_env(data_dir, e),
            providers=providers_from_env(e),
        )


def default_memory(data_dir: Path) -> MemorySettings:
    """Long memory's settings when none are given: the vault under data_dir, server-local."""
    return MemorySettings(vault_dir=data_dir / "vault", timezone=None)


def memory_from_env(data_dir: Path, e: dict[str, str]) -> MemorySettings:
    """Long memory's settings from the environment; the vault defaults to data_dir/vault."""
    vault = e.get("KEEL_VAULT_DIR")
    values: dict[str, Any] = {
        "vault_dir": Path(vault).resolve() if vault else (data_dir / "vault"),
        "timezone": e.get("KEEL_MEMORY_TZ") or None,  # None: the server's zone
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
    return MemorySettings(**values)
