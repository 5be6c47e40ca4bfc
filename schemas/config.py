"""Keel's settings, read from the environment once per process.

Workflow code never reads these: what a session needs (window, output limit, thresholds)
travels inside `SessionConfig`, so it is recorded in the workflow's history and replays
the same on any worker.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar, overload
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, TypeAdapter, field_validator

from schemas.budget import DEFAULT_PRICES, ModelPrice, PriceTable
from schemas.vault.schema import SearchMode
from schemas.vault.settings import (
    CRON_VARIABLES,
    ZONE_WANTED,
    MemorySettings,
    known_timezone,
)

DEFAULT_TASK_QUEUE = "keel-sessions"
DEFAULT_MODEL = "claude-sonnet-5"
# About 64M characters of window rows a worker keeps (text and content: about eight
# 1M-token windows).
DEFAULT_ROW_CACHE_CHARS = 64_000_000
VAULT_QUEUE_SUFFIX = "-vault"
N = TypeVar("N", int, float)
E = TypeVar("E", bound=StrEnum)
D = TypeVar("D")

# What a setting's number may be, one rule each: a Python caller's wrong value is pydantic's
# error, an environment variable's names the variable (`_Env`). A window, a limit or a size
# of zero or less, or a wait that is negative, infinite or NaN, would fail every session's
# turn or the worker's start later, far from the setting that caused it.
Count = Annotated[int, Field(gt=0)]  # tokens, bytes, characters: one or more
Amount = Annotated[int, Field(ge=0)]  # a size where 0 means none
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]  # a wait: 0 or more, finite
Factor = Annotated[float, Field(gt=0, allow_inf_nan=False)]  # a ratio: above 0, finite


def vault_queue(task_queue: str) -> str:
    """The vault's own task queue beside a session queue: the one rule, used by workers,
    schedules and (through `workflows.options`) the session workflow."""
    return f"{task_queue}{VAULT_QUEUE_SUFFIX}"


class ModelSettings(BaseModel):
    """How to reach the model. No API key means the offline deterministic model."""

    name: str = DEFAULT_MODEL
    base_url: str | None = None
    api_key: str | None = None
    context_window: Count = 200_000
    max_output_tokens: Count = 8_192
    # Where the price per token rises (for example 200,000 on long-context pricing); a
    # checkpoint starts before the context would cross it. None: no price step.
    price_step_tokens: Count | None = None
    request_timeout_s: float = 600.0
    # Stream the reply's text onto the session's event stream as it is generated
    # (KEEL_STREAM=0 turns it off: one reply at the end, as the benchmark compares).
    stream: bool = True
    # The offline model's tokenizer against Keel's (KEEL_OFFLINE_TOKEN_SKEW): it counts
    # that many times more, as a real model's tokenizer differs from the estimate's.
    offline_token_skew: Factor = 1.0
    # Asked instead of a session's model from a call's third attempt on, when the first two
    # failed in a way a retry could help (KEEL_FALLBACK_MODEL; a session's agent may name
    # its own: `AgentSpec.fallback_model`). None: every attempt asks the same model.
    fallback_model: str | None = None
    # How long a worker keeps asking the fallback first once it turned to it for a model
    # (KEEL_FALLBACK_HOLD_S): then a call tries the model itself again.
    fallback_hold_s: Seconds = 60.0

    @property
    def offline(self) -> bool:
        return not self.api_key and not self.base_url


class TemporalTLS(BaseModel):
    """How to reach a TLS Temporal cluster (Temporal Cloud, or your own with mTLS).

    Paths, never key material, so settings can be printed; the files are read when the
    client connects (`workers.connect`). Nothing set and no API key: plain TCP (the dev server).
    """

    api_key: str | None = None  # Temporal Cloud API key; implies TLS
    enabled: bool = False  # TLS on with the system's roots (set by any field below)
    client_cert_path: Path | None = None  # mTLS: client certificate (PEM)
    client_key_path: Path | None = None  # mTLS: its private key (PEM)
    server_root_ca_path: Path | None = None  # a private CA (PEM); None: the system's roots
    server_name: str | None = None  # the name the server's certificate is checked against

    @property
    def uses_tls(self) -> bool:
        return bool(self.enabled or self.api_key or self.client_cert_path
                    or self.server_root_ca_path or self.server_name)


class WorkspaceStoreKind(StrEnum):
    LOCAL = "local"  # a folder under data_dir: one worker (the embedded default)
    POSTGRES = "postgres"  # the workspace_files table: any worker on any host


class LogFormat(StrEnum):
    CONSOLE = "console"  # for a person at a terminal
    JSON = "json"  # one object a line, for a collector


class MetricsExport(StrEnum):
    """How a worker exports its metrics (workers.metrics)."""

    PROMETHEUS = "prometheus"  # an endpoint scraped at `metrics_address`/metrics
    OTLP = "otlp"  # pushed over OTLP/HTTP, to OpenTelemetry's standard endpoint variables


DEFAULT_METRICS_ADDRESS = "127.0.0.1:9464"


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


def temporal_address_problem(address: str) -> str | None:
    """Why `address` names no Temporal frontend (host:port, or a URL with its scheme), or
    None. The SDK reads a bare host as port 80 and a bad port as a traceback; Temporal's
    frontend listens on 7233 by default."""
    try:
        parts = urlsplit(address if "://" in address else f"//{address}")
        port = parts.port
    except ValueError as err:  # a port that is no number or past 65535, a broken [IPv6]
        return f"not host:port ({str(err).lower()})"
    if not parts.hostname or " " in address:
        return "not host:port"
    if port is None and not parts.scheme:
        return (f"a host without its port (Temporal's frontend listens on 7233 by default: "
                f"{parts.hostname}:7233)")
    if port == 0:
        return "not host:port (port 0)"
    return None


class KeelSettings(BaseModel):
    temporal_address: str | None = None
    temporal_namespace: str = "default"
    temporal_tls: TemporalTLS = Field(default_factory=TemporalTLS)
    task_queue: str = DEFAULT_TASK_QUEUE
    database_url: str | None = None
    workspace_store: WorkspaceStoreKind = WorkspaceStoreKind.LOCAL
    max_file_bytes: Count = 10_000_000  # one workspace file
    max_workspace_bytes: Count = 200_000_000  # all of one session's files together
    # About how much of the window rows it read a worker keeps between model calls
    # (activities.row_cache; 0: none).
    row_cache_chars: Amount = DEFAULT_ROW_CACHE_CHARS
    data_dir: Path = Path(".keel")
    model: ModelSettings = Field(default_factory=ModelSettings)
    max_message_chars: Count = 200_000
    user_name: str = "user"
    log_format: LogFormat = LogFormat.CONSOLE
    # How long a worker waits at start for Temporal and PostgreSQL to answer (a server
    # starting beside it); 0: it fails at once. Commands a person runs never wait.
    connect_wait_s: Seconds = 120.0
    # How long a stopping worker lets the activities it runs finish (a model call, a tool
    # call) before cancelling them: a rolling deploy's SIGTERM no longer cancels a reply
    # half streamed, to be asked for again on another worker.
    shutdown_grace_s: Seconds = 30.0
    # The stdio MCP commands this worker starts, as written in a spec, and the HTTP hosts it
    # reaches (`*` patterns) (None: any; empty: none); KEEL_MCP_STDIO_COMMANDS and
    # KEEL_MCP_HTTP_HOSTS, comma-separated, or `none`.
    mcp_stdio_commands: tuple[str, ...] | None = None
    mcp_http_hosts: tuple[str, ...] | None = None
    otel_exporter: str | None = None  # None | console | otlp
    # A worker's metrics, Temporal's and Keel's (workers.metrics): none by default.
    metrics: MetricsExport | None = None
    metrics_address: str = DEFAULT_METRICS_ADDRESS  # host:port, for prometheus
    # Long memory; by default the vault is data_dir/vault on the server's time zone.
    memory: MemorySettings = Field(default_factory=lambda data: default_memory(data["data_dir"]))
    # Provider profiles by name; "default" (this model's own) and "offline" always exist.
    providers: dict[str, ProviderProfile] = Field(default_factory=dict)
    # Dollars per million tokens by model-name prefix (schemas.budget): the defaults, with
    # KEEL_PRICES (JSON: {"prefix": {"input": 3, "output": 15, "cache_read": 0.3,
    # "cache_write": 3.75}}) over them.
    prices: PriceTable = Field(default_factory=lambda: dict(DEFAULT_PRICES))
    # Deployments whose sealed bundles an import takes as this one's own (schemas.
    # bundle_seal): name -> public key, as `keel seal-key` prints it there;
    # KEEL_TRUSTED_BUNDLE_KEYS="staging=<key>,laptop=<key>".
    trusted_bundle_keys: dict[str, str] = Field(default_factory=dict)

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

    @property
    def vault_task_queue(self) -> str:
        """Where the vault's activities and workflows run: one worker serves it."""
        return vault_queue(self.task_queue)

    @field_validator("temporal_address")
    @classmethod
    def _frontend(cls, value: str | None) -> str | None:
        if value is not None and (problem := temporal_address_problem(value)):
            raise ValueError(f"{value[:80]!r} is {problem}")
        return value

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> KeelSettings:
        e = _Env(dict(os.environ if env is None else env))
        data_dir = Path(e.get("KEEL_DATA_DIR", ".keel")).resolve()
        database_url = e.get("DATABASE_URL") or None
        # A database server is shared by every worker, so the workspace follows it there.
        store = e.choice("KEEL_WORKSPACE_STORE", WorkspaceStoreKind,
                         WorkspaceStoreKind.POSTGRES if database_url
                         else WorkspaceStoreKind.LOCAL)
        return cls(
            temporal_address=_address(e.get("TEMPORAL_ADDRESS") or None),
            temporal_namespace=e.get("TEMPORAL_NAMESPACE", "default"),
            temporal_tls=_tls_from_env(e),
            task_queue=e.get("KEEL_TASK_QUEUE", DEFAULT_TASK_QUEUE),
            database_url=database_url,
            workspace_store=store,
            max_file_bytes=e.count("KEEL_MAX_FILE_BYTES") or 10_000_000,
            max_workspace_bytes=e.count("KEEL_MAX_WORKSPACE_BYTES") or 200_000_000,
            row_cache_chars=_or(e.amount("KEEL_ROW_CACHE_CHARS"), DEFAULT_ROW_CACHE_CHARS),
            data_dir=data_dir,
            model=_model_from_env(e),
            max_message_chars=e.count("KEEL_MAX_MESSAGE_CHARS") or 200_000,
            user_name=e.get("KEEL_USER_NAME", "user"),
            log_format=e.choice("KEEL_LOG_FORMAT", LogFormat, LogFormat.CONSOLE),
            connect_wait_s=e.seconds("KEEL_CONNECT_WAIT_S", 120.0),
            shutdown_grace_s=e.seconds("KEEL_SHUTDOWN_GRACE_S", 30.0),
            mcp_stdio_commands=allowed_from_env(e.get("KEEL_MCP_STDIO_COMMANDS")),
            mcp_http_hosts=allowed_from_env(e.get("KEEL_MCP_HTTP_HOSTS")),
            otel_exporter=e.get("KEEL_OTEL_EXPORTER") or None,
            metrics=e.choice("KEEL_METRICS", MetricsExport, None, off="none"),
            metrics_address=e.get("KEEL_METRICS_ADDRESS") or DEFAULT_METRICS_ADDRESS,
            memory=memory_from_env(data_dir, e),
            providers=providers_from_env(e.values),
            prices=prices_from_env(e.values),
            trusted_bundle_keys=trusted_keys_from_env(e.get("KEEL_TRUSTED_BUNDLE_KEYS")),
        )


class _Env:
    """The environment's variables as settings read them: a number or a path, None when
    unset, and a variable given wrong named in the error."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    @overload
    def get(self, name: str) -> str | None: ...

    @overload
    def get(self, name: str, default: str) -> str: ...

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.values.get(name, default)

    def number(self, name: str, parse: Callable[[str], N], what: str,
               rule: Any) -> N | None:
        """The variable `name` parsed and held to `rule` (a type above), None when unset;
        one given wrong is named, with `what` it should be."""
        value = self.values.get(name)
        try:
            found = parse(value) if value else None
            if found is not None:
                TypeAdapter(rule).validate_python(found)
            return found
        except ValueError:  # pydantic's ValidationError is one
            raise ValueError(f"{name} is {(value or '')[:40]!r}, not {what}") from None

    def count(self, name: str) -> int | None:
        return self.number(name, int, "a whole number above 0", Count)

    def amount(self, name: str) -> int | None:
        return self.number(name, int, "a whole number, 0 or more", Amount)

    def seconds(self, name: str, default: float) -> float:
        found = self.number(name, float, "a number of seconds, 0 or more", Seconds)
        return default if found is None else found

    def factor(self, name: str, default: float) -> float:
        found = self.number(name, float, "a number above 0", Factor)
        return default if found is None else found

    def choice(self, name: str, kind: type[E], default: D, off: str = "") -> E | D:
        """The variable `name` as one of `kind`'s values (any case), `default` when unset or
        the word `off`; one given wrong is named, with the words it may be."""
        value = (self.values.get(name) or "").strip().lower()
        if not value or (off and value == off):
            return default
        try:
            return kind(value)
        except ValueError:
            *first, last = [str(v.value) for v in kind] + ([off] if off else [])
            raise ValueError(f"{name} is {self.values[name][:40]!r}, not "
                             f"{', '.join(first)} or {last}") from None

    def opt_path(self, name: str) -> Path | None:
        value = self.values.get(name)
        return Path(value).expanduser() if value else None


def _model_from_env(e: _Env) -> ModelSettings:
    return ModelSettings(
        name=e.get("KEEL_MODEL", DEFAULT_MODEL),
        base_url=e.get("ANTHROPIC_BASE_URL") or None,
        api_key=e.get("ANTHROPIC_API_KEY") or None,
        context_window=e.count("KEEL_CONTEXT_WINDOW") or 200_000,
        max_output_tokens=e.count("KEEL_MAX_OUTPUT_TOKENS") or 8_192,
        price_step_tokens=e.count("KEEL_PRICE_STEP_TOKENS"),
        stream=e.get("KEEL_STREAM", "1") not in ("0", "false", "no"),
        offline_token_skew=e.factor("KEEL_OFFLINE_TOKEN_SKEW", 1.0),
        fallback_model=e.get("KEEL_FALLBACK_MODEL") or None,
        fallback_hold_s=e.seconds("KEEL_FALLBACK_HOLD_S", 60.0),
    )


def _tls_from_env(e: _Env) -> TemporalTLS:
    return TemporalTLS(
        api_key=e.get("TEMPORAL_API_KEY") or None,
        enabled=(e.get("TEMPORAL_TLS") or "").lower() in ("1", "true", "yes"),
        client_cert_path=e.opt_path("TEMPORAL_TLS_CERT"),
        client_key_path=e.opt_path("TEMPORAL_TLS_KEY"),
        server_root_ca_path=e.opt_path("TEMPORAL_TLS_CA"),
        server_name=e.get("TEMPORAL_TLS_SERVER_NAME") or None,
    )


def trusted_keys_from_env(value: str | None) -> dict[str, str]:
    """KEEL_TRUSTED_BUNDLE_KEYS: `name=key` entries, comma-separated; ValueError naming the
    entry that is none."""
    from schemas.bundle_seal import trusted_keys_problem

    keys: dict[str, str] = {}
    for entry in (value or "").split(","):
        if not entry.strip():
            continue
        name, sep, key = entry.partition("=")
        if not sep:
            raise ValueError(f"KEEL_TRUSTED_BUNDLE_KEYS: {entry.strip()[:80]!r} is not "
                             "name=key")
        keys[name.strip()] = key.strip().lower()
    if problem := trusted_keys_problem(keys):
        raise ValueError(f"KEEL_TRUSTED_BUNDLE_KEYS: {problem}")
    return keys


def allowed_from_env(value: str | None) -> tuple[str, ...] | None:
    """KEEL_MCP_STDIO_COMMANDS, KEEL_MCP_HTTP_HOSTS: unset, anything; `none`, nothing;
    else the entries, comma-separated."""
    if value is None or not value.strip():
        return None
    if value.strip().lower() == "none":
        return ()
    return tuple(c.strip() for c in value.split(",") if c.strip())


def prices_from_env(e: dict[str, str]) -> PriceTable:
    """The default price table with KEEL_PRICES over it; a bad value is refused naming it."""
    table = dict(DEFAULT_PRICES)
    raw = e.get("KEEL_PRICES")
    if not raw:
        return table
    try:
        given = json.loads(raw)
        if not isinstance(given, dict):
            raise ValueError("not a JSON object")
        table.update({str(k): ModelPrice.model_validate(v) for k, v in given.items()})
    except ValueError as err:  # pydantic's ValidationError is one
        raise ValueError(f"KEEL_PRICES is not a price table: {err}") from None
    return table


def default_memory(data_dir: Path) -> MemorySettings:
    """Long memory's settings when none are given: the vault under data_dir, server-local."""
    return MemorySettings(vault_dir=data_dir / "vault", timezone=None)


def memory_from_env(data_dir: Path, env: _Env) -> MemorySettings:
    """Long memory's settings from the environment; the vault defaults to data_dir/vault."""
    e = env.values
    vault = e.get("KEEL_VAULT_DIR")
    values: dict[str, Any] = {
        "vault_dir": Path(vault).resolve() if vault else (data_dir / "vault"),
        "vaults_dir": Path(e["KEEL_VAULTS_DIR"]).resolve() if e.get("KEEL_VAULTS_DIR") else None,
        "timezone": _zone(e.get("KEEL_MEMORY_TZ") or None),  # None: the server's zone
        "notify_webhook_url": e.get("KEEL_NOTIFY_WEBHOOK") or None,
        "search_mode": env.choice("KEEL_MEMORY_SEARCH_MODE", SearchMode, SearchMode.AUTO),
        "embedder": e.get("KEEL_EMBEDDER") or None,
        "git_push": e.get("KEEL_VAULT_PUSH", "1") not in ("0", "false", "no"),
    }
    for job, name in CRON_VARIABLES.items():
        if e.get(name):
            values[f"{job}_cron"] = e[name]
    return MemorySettings(**values)


def _address(value: str | None) -> str | None:
    if value is not None and (problem := temporal_address_problem(value.strip())):
        raise ValueError(f"TEMPORAL_ADDRESS is {value[:80]!r}, {problem}")
    return None if value is None else value.strip()


def _zone(value: str | None) -> str | None:
    if value is not None and not known_timezone(value):
        raise ValueError(f"KEEL_MEMORY_TZ is {value[:60]!r}, not {ZONE_WANTED}")
    return value


def _or(value: int | None, default: int) -> int:
    """`value` when set (0 included), else `default`."""
    return default if value is None else value
