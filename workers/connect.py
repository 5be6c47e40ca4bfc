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
- A command a person waits on connects once and says why it could not; a worker starting
  beside its server (a compose stack coming up, a host's reboot) waits for it
  (`connect_when_up`, `KeelSettings.connect_wait_s`), where it failed at once.
- A process that made a client does not crash as it exits (below, `pause_at_exit`).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import time
from pathlib import Path

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from schemas.config import KeelSettings, TemporalTLS

__all__ = ["NoNamespaceError", "TLSSettingsError", "connect", "connect_when_up", "has_namespace",
           "pause_at_exit", "tls_config"]

log = logging.getLogger("keel.worker")
# Between tries while a server does not answer: doubling from the first, then capped.
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 5.0
# Why a process pauses at exit, and how long: see `pause_at_exit`.
EXIT_PAUSE_S = 0.05
_exit_pause_registered = False


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
    pause_at_exit()
    tls = settings.temporal_tls
    return await Client.connect(target, namespace=settings.temporal_namespace,
                                data_converter=pydantic_data_converter,
                                tls=tls_config(tls), api_key=tls.api_key, lazy=lazy)


def pause_at_exit() -> None:
    """Register, once per process, a short pause that runs with the atexit handlers
    (`connect` does; so does whatever makes a client another way, a WorkflowEnvironment).

    Each Temporal call ends on one of the Rust core's threads, which takes the GIL to hand
    the result to asyncio and then lets go of the call's Python objects. A script whose last
    call returns just before it ends (`asyncio.run(main())`, then the interpreter
    finalizes) can reach finalization while that thread is still at it: the thread then
    frees Python objects beside finalization's garbage collection, and the process dies
    with SIGSEGV or "Fatal Python error: PyGILState_Release" (exit 139 or 134) after its
    work was done (temporalio/sdk-python#300). Measured with the README's first client
    snippet against `keel dev`: 14 of 92 runs died so, and 3 of 30 of a script ending on
    50 calls at once; with this pause none of 60 and none of 40. The atexit handlers run
    before finalization starts, and a sleep gives the GIL away, so the core's threads
    finish first. (The CLI leaves by os._exit after the atexit handlers, `KeelApp`.)
    """
    global _exit_pause_registered
    if not _exit_pause_registered:
        _exit_pause_registered = True
        atexit.register(time.sleep, EXIT_PAUSE_S)


async def connect_when_up(settings: KeelSettings, wait_s: float | None = None) -> Client:
    """`connect`, tried again while Temporal does not answer or lacks the namespace (a
    stack whose setup makes it), for up to `wait_s` seconds (else
    `settings.connect_wait_s`); then its last failure. A setting that cannot work (no
    address, a TLS file missing) fails at once."""
    wait_s = settings.connect_wait_s if wait_s is None else wait_s
    deadline, pause = time.monotonic() + wait_s, RETRY_FIRST_S
    while True:
        try:
            client = await connect(settings)
            await has_namespace(client)
            return client
        except RuntimeError as err:  # Client.connect's "Failed client connect: ..."
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            why = str(err) if isinstance(err, NoNamespaceError) else \
                f"Temporal at {settings.temporal_address} does not answer ({str(err)[:200]})"
            log.warning("%s; trying again for %.0f s more", why, left)
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, RETRY_MAX_S)


class NoNamespaceError(RuntimeError):
    """The Temporal server has no namespace of the settings' name."""


async def has_namespace(client: Client) -> None:
    """`NoNamespaceError` when the server lacks the client's namespace: a worker polling
    one would run on, serving nothing, its polls refused without a word."""
    try:
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=client.namespace))
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise NoNamespaceError(
                f"Temporal at {client.service_client.config.target_host} has no namespace "
                f"{client.namespace!r}: check TEMPORAL_NAMESPACE, or create it (`temporal "
                f"operator namespace create --namespace {client.namespace}`)") from None
        raise
