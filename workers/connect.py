"""The one way every Keel process reaches Temporal: workers, the CLI, the client helper,
the embedded stack and the tests' worker processes all call `connect`.

It lives with the workers, the lowest layer that opens a client, so a worker never imports
from keel/; keel's modules import it from here.

Invariants:
- Every client gets the pydantic data converter (payload models are the contract).
- TLS and the API key come only from `KeelSettings.temporal_tls`; certificate files are
  read here, at connect time, so settings carry paths and can be printed safely.
- Imports temporalio and our settings only: no psycopg, no anthropic, no other module of
  workers/ (the client helper `keel.client` builds on it and must stay light).
"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import TLSConfig

from schemas.config import KeelSettings, TemporalTLS

__all__ = ["TLSSettingsError", "connect", "tls_config"]


class TLSSettingsError(ValueError):
    """A TLS setting that cannot work (a key without its certificate, a missing file)."""


def tls_config(tls: TemporalTLS) -> TLSConfig | bool:
    """What `Client.connect(tls=...)` gets: False (plain), True (system roots), or a
    `TLSConfig` with the CA, the client pair and the server name."""
    if not tls.uses_tls:
        return False
    if bool(tls.client_cert_path) != bool(tls.client_key_path):
        raise TLSSettingsError("mTLS needs both TEMPORAL_TLS_CERT and TEMPORAL_TLS_KEY")
    if not (tls.client_cert_path or tls.server_root_ca_path or tls.server_name):
        return True

    def read(path: object, what: str) -> bytes | None:
        if path is None:
            return None
        try:
            return Path(str(path)).read_bytes()
        except OSError as err:
            raise TLSSettingsError(f"cannot read the {what} {path}: {err}") from err

    return TLSConfig(
        server_root_ca_cert=read(tls.server_root_ca_path, "CA certificate"),
        domain=tls.server_name,
        client_cert=read(tls.client_cert_path, "client certificate"),
        client_private_key=read(tls.client_key_path, "client key"),
    )


async def connect(settings: KeelSettings, address: str | None = None, *,
                  lazy: bool = False) -> Client:
    """A client on `address` (else `settings.temporal_address`) and the settings' namespace,
    with their TLS and API key; `lazy` connects at the first call instead of now."""
    target = address or settings.temporal_address
    if not target:
        raise ValueError("no Temporal address")
    tls = settings.temporal_tls
    return await Client.connect(target, namespace=settings.temporal_namespace,
                                data_converter=pydantic_data_converter,
                                tls=tls_config(tls), api_key=tls.api_key, lazy=lazy)
